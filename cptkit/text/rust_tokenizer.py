"""A ``tokenizer.json`` folder read with the Rust ``tokenizers`` library alone.

Loading a tokenizer through transformers' ``AutoTokenizer`` imports transformers and torch: about
4.3 s of CPU on 2 cores before the first token, for a folder that ``tokenizers.Tokenizer`` reads in
0.2 s. When the folder's ``tokenizer_config.json`` names the generic class (``TokenizersBackend``,
``PreTrainedTokenizerFast``), transformers itself only wraps that same ``Tokenizer``: its ids are
``Tokenizer.encode_batch``'s. :func:`load_rust_tokenizer` gives that wrapper without transformers, for
what build-mix asks of a tokenizer (ids without special tokens, the EOS id, the vocabulary size);
any other folder (a model-specific class, its own code, padding or truncation set in the file, an
added token the file lacks) gets None, and the caller loads it through transformers as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC = ("TokenizersBackend", "PreTrainedTokenizerFast")
CHANGES = ("auto_map", "add_prefix_space", "split_special_tokens", "do_lower_case", "legacy", "add_bos_token",
           "add_eos_token")


class RustTokenizer:
    """The part of a transformers fast tokenizer that build-mix uses, over a ``tokenizers.Tokenizer``."""

    is_fast = True

    def __init__(self, backend: Any, eos_token: str, name: str):
        self.backend, self.eos_token, self.name_or_path = backend, eos_token, name
        self.eos_token_id = backend.token_to_id(eos_token)

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def __call__(self, text: str | list[str], add_special_tokens: bool = True,
                 return_attention_mask: bool = False) -> dict[str, Any]:
        """``{"input_ids": ids}`` for one text, or a list of them for a list (the attention mask is
        never built)."""
        if isinstance(text, str):
            return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}
        # encode_batch_fast (tokenizers >= 0.20): the same ids, without the character offsets that
        # nothing here reads (~20% less CPU on SmolLM2's BPE)
        batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return {"input_ids": [e.ids for e in batch(text, add_special_tokens=add_special_tokens)]}


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_rust_tokenizer(spec: str | None) -> RustTokenizer | None:
    """The folder ``spec`` as a :class:`RustTokenizer` when transformers would load it as the
    generic class over its ``tokenizer.json`` unchanged; None otherwise."""
    if not spec or str(spec) == "smollm2":  # the shipped GGUF's name (cptkit.models.lm.SMOLLM2), not a folder
        return None
    d = Path(spec)
    if not ((d / "tokenizer.json").is_file() and (d / "tokenizer_config.json").is_file()):
        return None
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    eos = _token(cfg.get("eos_token"))
    # the generic class, and none of the settings transformers applies on top of the file
    if cfg.get("tokenizer_class") not in GENERIC or eos is None or any(key in cfg for key in CHANGES):
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(d / "tokenizer.json"))
    except Exception:  # transformers reports what is wrong with the file
        return None
    added = [_token(t) for t in (cfg.get("added_tokens_decoder") or {}).values()]
    if backend.truncation or backend.padding or any(t is None or backend.token_to_id(t) is None for t in [*added, eos]):
        return None
    return RustTokenizer(backend, eos, str(d))
