"""Token ids of a very long text in bounded memory.

A Hugging Face fast tokenizer builds an ``Encoding`` of the whole text at once (token strings,
offsets, masks, alignments): about 300 bytes per character, 1.3 GB for a record of 5,000,000
characters (``io.max_record_chars``). :func:`encode_long` tokenizes a text longer than
``chunk`` characters piece by piece instead, cutting just before a space (or a CJK punctuation
mark) that follows a non-space character: where regex pre-tokenizers (byte-level BPE of GPT-2,
Llama 3, SmolLM ...) start a new pre-token anyway. Each cut is checked on the text around it (the
ids of the window whole must be those of its two halves), so the ids are the whole text's; a
tokenizer for which no nearby cut passes gets the text whole.
"""

from __future__ import annotations

import re
from typing import Any

ENCODE_CHUNK = 100_000  # characters tokenized at once
_CUT = re.compile(r"(?<=\S)[\s\u3000\u3001\u3002\uff0c\uff1b\uff1a\uff01\uff1f]")
_WINDOW = 64  # characters each side of a cut that the check tokenizes
_TRIES = 16  # cut candidates checked per piece before the text is tokenized whole


def _ids(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]


def _cut(tok: Any, text: str, start: int, chunk: int) -> int | None:
    """Where the piece from ``start`` ends: a checked cut in its second half, or None."""
    cands = [m.start() for m in _CUT.finditer(text, start + chunk // 2, start + chunk)]
    for k in reversed(cands[-_TRIES:]):
        a, b = max(start, k - _WINDOW), k + _WINDOW
        if _ids(tok, text[a:b]) == _ids(tok, text[a:k]) + _ids(tok, text[k:b]):
            return k
    return None


def encode_long(tok: Any, text: str, chunk: int = ENCODE_CHUNK) -> list[int]:
    """``tok(text, add_special_tokens=False)["input_ids"]``, tokenizing at most about ``chunk``
    characters at a time (a text of at most ``chunk`` characters in one call)."""
    if len(text) <= chunk:
        return _ids(tok, text)
    ids: list[int] = []
    start = 0
    while len(text) - start > chunk:
        end = _cut(tok, text, start, chunk)
        if end is None:  # no cut keeps the ids: the rest whole
            break
        ids += _ids(tok, text[start:end])
        start = end
    ids += _ids(tok, text[start:])
    return ids


def encode_many(tok: Any, texts: list[str], chunk: int = ENCODE_CHUNK) -> list[list[int]]:
    """:func:`encode_long` of each text: the texts of at most ``chunk`` characters in one batched
    call (the fast path), the longer ones in pieces."""
    short = [i for i, x in enumerate(texts) if len(x) <= chunk]
    ids: list[list[int]] = [[] for _ in texts]
    if short:
        for i, got in zip(short, _ids(tok, [texts[i] for i in short]), strict=True):
            ids[i] = got
    for i, x in enumerate(texts):
        if len(x) > chunk:
            ids[i] = encode_long(tok, x, chunk)
    return ids
