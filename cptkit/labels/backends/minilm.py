"""The MiniLM backend (``train.backend=minilm``): a BERT-style encoder (default all-MiniLM-L6-v2)
fine-tuned with a classification head, saved as a Hugging Face folder (``hf/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cptkit.labels.backends.base import BACKENDS, ClassifierBackend, Examples
from cptkit.labels.config import MiniLMParams, TrainParams
from cptkit.labels.encoder import minilm_path
from cptkit.models.remote_code import remote_code_kwargs


@BACKENDS.register("minilm")
class MiniLMClassifier(ClassifierBackend):
    """A BERT-style encoder (default: all-MiniLM-L6-v2) with a classification head."""

    def __init__(self, model: Any, tokenizer: Any, labels: list[str], info: dict[str, Any]):
        self.model, self.tokenizer, self.labels, self.info = model, tokenizer, labels, info
        self.max_chars = int(info.get("max_chars", 4000))
        self.max_length = int(info.get("max_length", 128))
        self.batch_size = int(info.get("batch_size", 32))

    @classmethod
    def fit(cls, ex: Examples, params: TrainParams, seed: int, progress: Any = None) -> MiniLMClassifier:
        return cls.train(ex.texts, ex.labels, ex.classes, params.minilm, seed, params.max_chars, progress)

    @classmethod
    def load(cls, directory: Path, info: dict[str, Any]) -> MiniLMClassifier:
        from transformers import (  # deferred: heavy
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        hf = directory / "hf"
        kw = remote_code_kwargs(hf)  # a shared classifier folder never runs its own code
        model = AutoModelForSequenceClassification.from_pretrained(str(hf), **kw).eval()
        return cls(model, AutoTokenizer.from_pretrained(str(hf), **kw), list(info["labels"]), info)

    @classmethod
    def train(cls, texts: list[str], labels: list[str], classes: list[str], p: MiniLMParams,
              seed: int, max_chars: int, progress: Any = None) -> MiniLMClassifier:
        import torch  # deferred: heavy (with transformers)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.manual_seed(seed)
        if p.threads:
            torch.set_num_threads(p.threads)
        src = p.model or minilm_path()
        kw = remote_code_kwargs(src)  # an encoder folder never runs its own code
        tok = AutoTokenizer.from_pretrained(src, **kw)
        model = AutoModelForSequenceClassification.from_pretrained(
            src, **kw, num_labels=len(classes), id2label=dict(enumerate(classes)),
            label2id={c: i for i, c in enumerate(classes)})
        y = torch.tensor([classes.index(lab) for lab in labels])
        opt = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay, fused=True)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(p.epochs):
            order = torch.randperm(len(texts), generator=gen).tolist()
            for b in range(0, len(order), p.batch_size):
                batch = order[b:b + p.batch_size]
                enc = tok([texts[i][:max_chars] for i in batch], truncation=True, max_length=p.max_length,
                          padding=True, return_tensors="pt")
                loss = model(**enc, labels=y[batch]).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                if progress is not None:
                    progress(len(batch))
        model.eval()
        info = {"backend": "minilm", "max_chars": max_chars, "max_length": p.max_length,
                "batch_size": max(p.batch_size, 32), "base_model": src}
        return cls(model, tok, classes, info)

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        import torch  # deferred: heavy

        out = []
        with torch.inference_mode():
            for b in range(0, len(texts), self.batch_size):
                enc = self.tokenizer([t[:self.max_chars] for t in texts[b:b + self.batch_size]],
                                     truncation=True, max_length=self.max_length, padding=True,
                                     return_tensors="pt")
                out.append(torch.softmax(self.model(**enc).logits.float(), dim=-1).numpy())
        return np.concatenate(out).astype(np.float64) if out else np.zeros((0, len(self.labels)))

    def save(self, directory: Path) -> None:
        self.model.save_pretrained(str(directory / "hf"))
        self.tokenizer.save_pretrained(str(directory / "hf"))

