"""Tokenization for BM25: Unicode lowercase, split on non-word characters, CJK bigrams.

The default (docs/retrieve.md): ``text.lower()``; split on the regex ``\\W+`` (Unicode word
characters are letters, digits and ``_``); no stopwords, no stemming. Runs of CJK characters
(Han, Hiragana, Katakana, Hangul) have no spaces between words, so a run becomes its
overlapping character bigrams (``机器学习`` → ``机器 器学 学习``), as Lucene's CJKAnalyzer does;
a run of one character stays a unigram. ``cjk_unigrams=true`` adds every character as well
(higher recall for one-character queries, more noise). Mixed tokens (``python教程``) are split
at script boundaries first (``python``, ``教程``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Han (incl. ext. A and compatibility), Hiragana, Katakana, Hangul syllables/jamo, CJK punctuation-free.
CJK_CLASS = (
    "\u1100-\u11ff\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ebef"
)
_CJK_ANY = re.compile(f"[{CJK_CLASS}]")
_CJK_SPLIT = re.compile(f"([{CJK_CLASS}]+)")


@dataclass
class TokenizerConfig:
    """How text becomes BM25 terms. Stored in every index; queries use the index's copy."""

    lowercase: bool = True
    split: str = r"\W+"  # regex separating tokens
    cjk: str = "bigram"  # bigram | unigram | none (none: a CJK run is one token, as split yields it)
    cjk_unigrams: bool = False  # with cjk=bigram: also emit every CJK character
    stopwords: list[str] = field(default_factory=list)
    min_length: int = 1  # drop tokens shorter than this many characters (CJK grams exempt)


def cjk_grams(run: str, mode: str, unigrams: bool) -> list[str]:
    """Terms of one run of CJK characters."""
    if mode == "unigram" or len(run) == 1:
        return list(run)
    grams = [run[i:i + 2] for i in range(len(run) - 1)]
    return grams + list(run) if unigrams else grams


class Tokenizer:
    """A callable ``text -> list[str]`` built from a :class:`TokenizerConfig`."""

    def __init__(self, cfg: TokenizerConfig | dict[str, Any] | None = None):
        if cfg is None:
            cfg = TokenizerConfig()
        elif isinstance(cfg, dict):
            cfg = TokenizerConfig(**cfg)
        if cfg.cjk not in ("bigram", "unigram", "none"):
            raise ValueError(f"tokenizer.cjk must be bigram, unigram or none, got {cfg.cjk!r}")
        self.cfg = cfg
        self._split = re.compile(cfg.split)
        self._stop = frozenset(w.lower() if cfg.lowercase else w for w in cfg.stopwords)

    def config(self) -> dict[str, Any]:
        c = self.cfg
        return {"lowercase": c.lowercase, "split": c.split, "cjk": c.cjk, "cjk_unigrams": c.cjk_unigrams,
                "stopwords": list(c.stopwords), "min_length": c.min_length}

    def __call__(self, text: str) -> list[str]:
        c = self.cfg
        if c.lowercase:
            text = text.lower()
        toks = [t for t in self._split.split(text) if t]
        if c.cjk != "none" and _CJK_ANY.search(text):
            out: list[str] = []
            for t in toks:
                if not _CJK_ANY.search(t):
                    out.append(t)
                    continue
                for i, part in enumerate(_CJK_SPLIT.split(t)):
                    if part:
                        out.extend(cjk_grams(part, c.cjk, c.cjk_unigrams) if i % 2 else [part])
            toks = out
            cjk = _CJK_ANY.match
            if c.min_length > 1:
                toks = [t for t in toks if len(t) >= c.min_length or cjk(t)]
        elif c.min_length > 1:
            toks = [t for t in toks if len(t) >= c.min_length]
        if self._stop:
            toks = [t for t in toks if t not in self._stop]
        return toks

    def many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self(t) for t in texts]


def make_tokenizer(cfg: Any = None) -> Callable[[str], list[str]]:
    """A tokenizer from a dataclass, a dict or an OmegaConf node."""
    if cfg is not None and not isinstance(cfg, (TokenizerConfig, dict)):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    return Tokenizer(cfg)
