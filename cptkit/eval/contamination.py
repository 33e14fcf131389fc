"""N-gram overlap between training documents and benchmark test items (Retrieve-Pile §4.3, Table 6).

Text is normalised (lower case, words = runs of letters/digits, as Overlapy and lm-eval's
decontamination do; each CJK character is one word, since Chinese and Japanese have no spaces and
a whole sentence would otherwise be one word: an 8-gram of C-Eval/CMMLU/GaoKao text is 8
characters) and every word n-gram (default n = 8; 13 in lm-eval's decontamination) is
hashed to 64 bits with xxhash. A benchmark is a sorted ``uint64`` array of its items' n-gram
hashes with the item each came from; a document is contaminated for a benchmark when one of its
n-gram hashes is in that array (``numpy.searchsorted``: O(n log m), memory 16 bytes per test
n-gram, nothing kept per document). With 64-bit hashes a false hit needs a collision
(probability ~ n_doc_ngrams · n_test_ngrams / 2^64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

from cptkit.text.tokenize import word_tokenizer

REPORT = "_contamination.json"  # written by evaluate-contamination, read by evaluate eval.contamination=

_WORDS = word_tokenizer("contamination")


def words(text: str) -> list[str]:
    """Lower-cased word tokens: runs of letters, digits, underscore; each CJK character alone."""
    return _WORDS(text)


def ngram_hashes(text: str, n: int) -> np.ndarray:
    """64-bit hashes of the word n-grams of ``text`` (none when it has fewer than ``n`` words)."""
    ws = words(text)
    if len(ws) < n:
        return np.empty(0, dtype=np.uint64)
    grams = [" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)]
    return np.fromiter((xxhash.xxh3_64_intdigest(g.encode("utf-8")) for g in grams), dtype=np.uint64, count=len(grams))


@dataclass
class BenchmarkIndex:
    """The n-gram hashes of one benchmark's test items, sorted, with the item of each."""

    name: str
    n: int
    hashes: np.ndarray
    items: np.ndarray
    n_items: int
    n_checkable: int = 0  # items with at least n words

    @classmethod
    def build(cls, name: str, texts: list[str], n: int) -> BenchmarkIndex:
        hs, its = [], []
        for i, t in enumerate(texts):
            h = np.unique(ngram_hashes(t, n))
            hs.append(h)
            its.append(np.full(len(h), i, dtype=np.int64))
        h = np.concatenate(hs) if hs else np.empty(0, dtype=np.uint64)
        it = np.concatenate(its) if its else np.empty(0, dtype=np.int64)
        order = np.argsort(h, kind="stable")
        return cls(name, n, h[order], it[order], len(texts), sum(1 for x in hs if len(x)))

    def match(self, doc_hashes: np.ndarray) -> set[int]:
        """Test items sharing at least one n-gram with a document (empty set: clean)."""
        if len(self.hashes) == 0 or len(doc_hashes) == 0:
            return set()
        pos = np.searchsorted(self.hashes, doc_hashes)
        pos[pos == len(self.hashes)] = 0
        hit = self.hashes[pos] == doc_hashes
        if not hit.any():
            return set()
        found: set[int] = set()
        for h in np.unique(doc_hashes[hit]):
            lo = np.searchsorted(self.hashes, h, side="left")
            hi = np.searchsorted(self.hashes, h, side="right")
            found.update(int(x) for x in self.items[lo:hi])
        return found


def contamination_report(docs_total: int, docs_hit: dict[str, int], items_hit: dict[str, set[int]],
                         indexes: dict[str, BenchmarkIndex],
                         item_ids: dict[str, list[str]] | None = None) -> dict[str, dict]:
    """Per benchmark: share of documents with an overlap and share of test items hit (Table 6).

    ``test_items_hit_ids``: the hit items' ids (``id_field`` or position), as ``evaluate`` names them.
    """
    out = {}
    for name, ix in indexes.items():
        hit = len(items_hit.get(name, ()))
        ids = (item_ids or {}).get(name) or [str(i) for i in range(ix.n_items)]
        out[name] = {"ngram": ix.n, "docs": docs_total, "docs_contaminated": docs_hit.get(name, 0),
                     "docs_share": docs_hit.get(name, 0) / docs_total if docs_total else 0.0,
                     "test_items": ix.n_items, "test_items_checkable": ix.n_checkable, "test_items_hit": hit,
                     "test_items_share": hit / ix.n_items if ix.n_items else 0.0,
                     "test_items_hit_ids": [ids[i] for i in sorted(items_hit.get(name, ()))]}
    return out
