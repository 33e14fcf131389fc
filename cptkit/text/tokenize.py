"""Words and CJK: the one CJK character class and the one word tokenizer of cptkit, with its presets.

**CJK characters.** Every CJK range in cptkit is defined here, as named Unicode blocks
(:data:`HAN`, :data:`KANA`, :data:`HANGUL`, ...). :data:`CJK_CLASS` is *the* CJK class (Han
incl. the supplementary-plane extensions, Hiragana, Katakana, Hangul syllables and jamo): text
in these scripts has no spaces between words, so a tokenizer treats it character by character.
Presets whose outputs are already fixed on disk use a documented subset or superset of it,
built from the same blocks (see the table below); nothing else in cptkit spells a CJK range.
:data:`CJK_TEXT_CLASS` is not a tokenizer class but a detector of Chinese/Japanese *text*
(punctuation and full-width forms included, Hangul syllables not: Korean is written with spaces).

**Words.** :func:`word_tokenizer` gives a named preset: a :class:`WordTokenizer` (``findall`` of
one regex over the text, lower-cased when the preset says so, with an exact ASCII fast path
where one exists) or, for ``bm25``, :class:`Tokenizer` with its default config. The presets
reproduce, token for token, what each consumer has always done; they differ where an output
already on disk or a published definition depends on the difference. The CJK classes of
``minhash``, ``synthesis`` and ``bm25`` differ in rarely seen blocks (Hangul jamo such as ``ㅋㅋ``,
Bopomofo, radicals, supplementary-plane Han) with no recorded reason, but unifying them
would change the tokens of text containing those characters, so each keeps its own (pinned by
tests/test_text_tokenize.py against the original regexes):

``contamination``
    Lower-case; each :data:`CJK_CLASS` character alone, other runs of Unicode word characters
    (letters, digits, ``_``) whole. Outside CJK these are the n-gram words of lm-eval/GPT-3
    decontamination (and Overlapy), so English overlaps stay comparable with published ones; a
    CJK run is not one word (Chinese and Japanese have no spaces: a whole sentence would be one
    "word" and C-Eval/CMMLU/GaoKao items would never reach 8 words), so CJK n-grams count characters.
``bm25``
    Runs of Unicode word characters ``\\w+`` (BM25's default ``split: \\W+`` yields exactly
    these runs, so both use one regex), then runs of :data:`CJK_CLASS` characters become overlapping bigrams
    (below). Indexes record their tokenizer config; queries must tokenize as the index did.
``minhash``
    Lower-case; each CJK character alone, other runs of word characters whole
    (``dedup.tokenizer=words``). CJK is :data:`MINHASH_CJK`: the Han, kana and Hangul-syllable
    blocks of :data:`CJK_CLASS` without jamo and supplementary-plane Han, plus Bopomofo and the
    CJK radicals (symbols, so they are tokens here and separators elsewhere). MinHash signatures
    and shingle sets in existing dedup caches (``.cptkit/sig-*.npy``) depend on these tokens.
``whitespace``
    Lower-case; runs of non-space characters (``dedup.tokenizer=whitespace``).
``synthesis``
    Case kept; like ``minhash`` but words joined by apostrophes are one word (``don't``,
    ``l’eau``) and CJK is :data:`SYNTHESIS_CJK` (Han, kana, Hangul syllables). The word counts
    drive the length filters and cuts of synthesize-qa and expand-queries, whose outputs depend
    on them.
``fasttext``
    Lower-case; each Han character, runs of letters and digits, each punctuation mark or symbol
    (``_`` and spaces dropped): the input line of fastText classifiers (``tokenizer: 2`` in
    ``classifier.json``). CJK is :data:`HAN` only (kana and Hangul stay in letter runs), as the
    trained quality and topic models saw it. Lower-cased ASCII text takes an ASCII-only regex
    with the same tokens, ~1.7x faster.
``fasttext_v1``
    As ``fasttext`` but digits split from letters (``abc123`` → ``abc 123``) and Han characters
    after letters stay in the letter run: classifiers saved without a ``tokenizer`` version were
    trained on it.

**BM25 terms** (:class:`Tokenizer`, docs/retrieve.md): ``text.lower()``; split on the regex
``\\W+`` (Unicode word characters are letters, digits and ``_``); no stopwords, no stemming. Runs of
CJK characters have no spaces between words, so a run becomes its overlapping character bigrams
(``机器学习`` → ``机器 器学 学习``), as Lucene's CJKAnalyzer does; a run of one character stays a
unigram. ``cjk_unigrams=true`` adds every character as well (higher recall for one-character
queries, more noise). Mixed tokens (``python教程``) are split at script boundaries first
(``python``, ``教程``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# -- CJK: the Unicode blocks (regex character-class ranges) -----------------------------------
HAN_EXT_A = "\u3400-\u4dbf"  # CJK Unified Ideographs Extension A
HAN_UNIFIED = "\u4e00-\u9fff"  # CJK Unified Ideographs
HAN_COMPAT = "\uf900-\ufaff"  # CJK Compatibility Ideographs
HAN = HAN_EXT_A + HAN_UNIFIED + HAN_COMPAT  # the Han characters of the Basic Multilingual Plane
HAN_SUPPLEMENT = "\U00020000-\U0002ebef"  # Extensions B-F (supplementary plane)
KANA = "\u3040-\u30ff"  # Hiragana, Katakana
HANGUL = "\uac00-\ud7af"  # Hangul syllables
HANGUL_JAMO = "\u1100-\u11ff\u3130-\u318f"  # Hangul Jamo, Hangul Compatibility Jamo
BOPOMOFO = "\u3100-\u312f"
CJK_RADICALS = "\u2e80-\u2fdf"  # CJK Radicals Supplement, Kangxi Radicals (symbols: not \w)
CJK_BLOCKS = "\u2e80-\u9fff"  # radicals .. unified ideographs: CJK punctuation, kana, enclosed, ...
FULLWIDTH = "\uff00-\uffef"  # Halfwidth and Fullwidth Forms

#: The CJK class: Han (BMP and supplementary), Hiragana, Katakana, Hangul syllables and jamo.
CJK_CLASS = HANGUL_JAMO + KANA + HAN + HANGUL + HAN_SUPPLEMENT
#: ``minhash``: CJK_CLASS without jamo and supplementary Han, plus radicals and Bopomofo.
MINHASH_CJK = CJK_RADICALS + KANA + BOPOMOFO + HAN + HANGUL
#: ``synthesis``: CJK_CLASS without jamo and supplementary Han.
SYNTHESIS_CJK = KANA + HAN + HANGUL
#: Chinese/Japanese text (not a tokenizer class): all CJK blocks, compatibility ideographs,
#: full-width forms; not Hangul syllables.
CJK_TEXT_CLASS = CJK_BLOCKS + HAN_COMPAT + FULLWIDTH

_CJK_ANY = re.compile(f"[{CJK_CLASS}]")
_CJK_SPLIT = re.compile(f"([{CJK_CLASS}]+)")


# -- the word tokenizer --------------------------------------------------------------------------
class WordTokenizer:
    """One preset of the word tokenizer: ``text -> list[str]``, the ``findall`` of :attr:`regex`.

    ``lowercase``: the text is lower-cased first. ``ascii_regex``: a pattern giving the same tokens
    on lower-cased ASCII text, faster (used when the lower-cased text is ASCII). ``ascii_bytes``
    (``word`` | ``nonspace``): the preset's tokens on ASCII text are also what
    :meth:`ascii_table` makes of it with one ``bytes.translate`` (for compiled consumers).
    Hot loops bind :attr:`findall` (the regex's own, no lower-casing) once.
    """

    __slots__ = ("name", "regex", "lowercase", "ascii_regex", "ascii_bytes", "findall", "_ascii_findall")

    def __init__(self, name: str, pattern: str, *, lowercase: bool, ascii_pattern: str | None = None,
                 ascii_bytes: str | None = None):
        if ascii_pattern is not None and not lowercase:
            raise ValueError("an ASCII fast path is exact on lower-cased text only")
        if ascii_bytes not in (None, "word", "nonspace"):
            raise ValueError(f"ascii_bytes must be word or nonspace, got {ascii_bytes!r}")
        self.name, self.lowercase, self.ascii_bytes = name, lowercase, ascii_bytes
        self.regex = re.compile(pattern)
        self.ascii_regex = re.compile(ascii_pattern) if ascii_pattern is not None else None
        self.findall = self.regex.findall
        self._ascii_findall = self.ascii_regex.findall if self.ascii_regex is not None else None

    def __call__(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        if self._ascii_findall is not None and text.isascii():
            return self._ascii_findall(text)
        return self.findall(text)

    def __repr__(self) -> str:
        return f"WordTokenizer({self.name!r})"

    def ascii_table(self, lowercase: bool | None = None) -> bytes:
        """A ``bytes.translate`` table that turns ASCII text into this preset's tokens separated by
        ASCII whitespace (``bytes.split()``); ``lowercase`` defaults to the preset's. Exactly the
        regex's tokens on ASCII input, ~4x faster (the common case).

        ``word``: bytes outside ``[A-Za-z0-9_]`` become spaces. ``nonspace``: the separators
        ``str.split()`` knows but ``bytes.split()`` does not (0x1C-0x1F) become spaces.
        """
        if self.ascii_bytes is None:
            raise ValueError(f"word tokenizer {self.name!r} has no ASCII translate table")
        lower = self.lowercase if lowercase is None else lowercase
        word = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
        table = []
        for c in range(256):
            if lower and 65 <= c <= 90:
                table.append(c + 32)
            elif self.ascii_bytes == "word":
                table.append(c if c in word else 32)
            else:
                table.append(32 if 0x1C <= c <= 0x1F else c)
        return bytes(table)


_PRESETS: dict[str, WordTokenizer] = {
    "contamination": WordTokenizer("contamination", rf"[{CJK_CLASS}]|[^\W{CJK_CLASS}]+", lowercase=True),
    "minhash": WordTokenizer("minhash", rf"[{MINHASH_CJK}]|[^\W{MINHASH_CJK}]+", lowercase=True,
                             ascii_bytes="word"),
    "whitespace": WordTokenizer("whitespace", r"\S+", lowercase=True, ascii_bytes="nonspace"),
    "synthesis": WordTokenizer("synthesis", rf"[{SYNTHESIS_CJK}]|[^\W{SYNTHESIS_CJK}]+(?:['’][^\W{SYNTHESIS_CJK}]+)*",
                               lowercase=False),
    "fasttext": WordTokenizer("fasttext", rf"[{HAN}]|[^\W_{HAN}]+|[^\w\s]", lowercase=True,
                              ascii_pattern=r"[a-z0-9]+|[^\sa-z0-9_]"),
    "fasttext_v1": WordTokenizer("fasttext_v1", rf"[{HAN}]|[^\W\d_]+|\d+|[^\w\s]", lowercase=True),
}
WORD_PRESETS = (*_PRESETS, "bm25")
_DEFAULT_SPLIT = r"\W+"  # BM25's default split: its tokens are the \w+ runs
_WORD_RUNS = WordTokenizer("bm25", r"\w+", lowercase=True)


# -- BM25 terms -------------------------------------------------------------------------------
@dataclass
class TokenizerConfig:
    """How text becomes BM25 terms. Stored in every index; queries use the index's copy."""

    lowercase: bool = True
    split: str = _DEFAULT_SPLIT  # regex separating tokens
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
        if cfg.split == _DEFAULT_SPLIT:  # the pieces of a \W+ split are the \w+ runs
            self._tokens: Callable[[str], list[str]] = _WORD_RUNS.findall
        else:
            split = re.compile(cfg.split).split
            self._tokens = lambda text: [t for t in split(text) if t]
        self._stop = frozenset(w.lower() if cfg.lowercase else w for w in cfg.stopwords)

    def config(self) -> dict[str, Any]:
        c = self.cfg
        return {"lowercase": c.lowercase, "split": c.split, "cjk": c.cjk, "cjk_unigrams": c.cjk_unigrams,
                "stopwords": list(c.stopwords), "min_length": c.min_length}

    def __call__(self, text: str) -> list[str]:
        c = self.cfg
        if c.lowercase:
            text = text.lower()
        toks = self._tokens(text)
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


# -- the presets, by name ----------------------------------------------------------------------
_BM25 = Tokenizer()  # the bm25 preset: the default TokenizerConfig


def word_tokenizer(preset: str) -> WordTokenizer | Tokenizer:
    """The named preset (see the module docstring): a :class:`WordTokenizer`, or for ``bm25`` the
    :class:`Tokenizer` of the default :class:`TokenizerConfig`. Both are ``text -> list[str]``."""
    if preset == "bm25":
        return _BM25
    try:
        return _PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown word tokenizer {preset!r}; choose one of {', '.join(WORD_PRESETS)}") from None

