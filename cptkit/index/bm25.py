"""The fast in-process BM25 backend: CSC postings in ``.npy`` files, searched by a numba kernel.

Layout of an index directory (all arrays memory-mapped on load):

* ``vocab.json``: the terms, in term-id order.
* ``indptr.npy`` (int64, terms + 1): term ``t``'s postings are ``[indptr[t], indptr[t+1])``.
* ``post_doc.npy`` (int32), ``post_tf.npy`` (int32): document index and term frequency, by term
  then document.
* ``post_score.npy`` (float32 or float64): the precomputed BM25 contribution of each posting,
  ``IDF(t) · tf (k1 + 1) / (tf + k1 (1 − b + b |d| / avgdl))``.
* ``doc_len.npy`` (int32): document lengths in tokens. ``bm25.json``: parameters and stats.

Searching a query adds the precomputed scores of its terms' postings into a per-document
accumulator and keeps the best k in a bounded heap ordered by (score, then lower document
index). Queries whose terms have many postings (≥ N/8) accumulate branch-free and scan all N
documents once; rare-term queries track the touched documents instead, so their cost is
O(postings) however large N is. Only documents containing a query term are returned.
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from numba import njit

from cptkit.index.base import BM25Params, Searcher, SearchResult, idf, term_weight

FILES = ("vocab.json", "indptr.npy", "post_doc.npy", "post_tf.npy", "post_score.npy", "doc_len.npy", "bm25.json")


@njit(cache=True, inline="always")
def _worse(s1, d1, s2, d2):  # pragma: no cover - numba
    return s1 < s2 or (s1 == s2 and d1 > d2)


@njit(cache=True, inline="always")
def _offer(hs, hd, m, k, v, d):  # pragma: no cover - numba
    """Offer (score v, doc d) to a min-heap of the best ``k``; returns the new heap size."""
    if m < k:
        i = m
        hs[i], hd[i] = v, d
        while i > 0:
            p = (i - 1) // 2
            if _worse(hs[i], hd[i], hs[p], hd[p]):
                hs[i], hs[p] = hs[p], hs[i]
                hd[i], hd[p] = hd[p], hd[i]
                i = p
            else:
                break
        return m + 1
    if not _worse(hs[0], hd[0], v, d):
        return m
    hs[0], hd[0] = v, d
    i = 0
    while True:
        w = 2 * i + 1
        if w >= m:
            break
        if w + 1 < m and _worse(hs[w + 1], hd[w + 1], hs[w], hd[w]):
            w += 1
        if _worse(hs[w], hd[w], hs[i], hd[i]):
            hs[i], hs[w] = hs[w], hs[i]
            hd[i], hd[w] = hd[w], hd[i]
            i = w
        else:
            break
    return m


@njit(cache=True, nogil=True)
def _search_batch(q_ptr, q_terms, indptr, post_doc, post_score, positive, n_docs, k):  # pragma: no cover
    """Top-k of every query: (docs, scores, counts). See the module docstring."""
    nq = q_ptr.size - 1
    out_docs = np.full((nq, k), -1, np.int64)
    out_scores = np.zeros((nq, k), np.float64)
    counts = np.zeros(nq, np.int64)
    acc = np.zeros(n_docs, post_score.dtype)  # float32 postings sum in float32 (like bm25s)
    seen = np.zeros(n_docs, np.bool_)
    touched = np.empty(n_docs, np.int64)
    hs = np.empty(k, np.float64)
    hd = np.empty(k, np.int64)
    for qi in range(nq):
        n_post = 0
        all_pos = True
        for j in range(q_ptr[qi], q_ptr[qi + 1]):
            t = q_terms[j]
            n_post += indptr[t + 1] - indptr[t]
            all_pos = all_pos and positive[t]
        m = 0
        if n_post == 0:
            continue
        if all_pos and n_post * 8 >= n_docs:
            # Dense: branch-free accumulation, then one scan (touched <=> score > 0).
            for j in range(q_ptr[qi], q_ptr[qi + 1]):
                t = q_terms[j]
                for p in range(indptr[t], indptr[t + 1]):
                    acc[post_doc[p]] += post_score[p]
            floor = 0.0  # 0 until the heap is full, then its worst score (rarely beaten: no mispredicts)
            for d in range(n_docs):
                v = np.float64(acc[d])
                acc[d] = 0.0
                if v > floor:  # a later document loses ties, so strictly greater
                    m = _offer(hs, hd, m, k, v, d)
                    if m == k:
                        floor = hs[0]
        else:
            # Sparse: track the touched documents (also exact when some IDF is <= 0).
            c = 0
            for j in range(q_ptr[qi], q_ptr[qi + 1]):
                t = q_terms[j]
                for p in range(indptr[t], indptr[t + 1]):
                    d = post_doc[p]
                    if not seen[d]:
                        seen[d] = True
                        touched[c] = d
                        c += 1
                    acc[d] += post_score[p]
            for i in range(c):
                d = touched[i]
                fv = np.float64(acc[d])
                if m < k or fv > hs[0] or (fv == hs[0] and d < hd[0]):
                    m = _offer(hs, hd, m, k, fv, d)
                acc[d] = 0.0
                seen[d] = False
        docs = hd[:m].copy()
        order0 = np.argsort(docs)
        neg = np.empty(m, np.float64)
        for i in range(m):
            neg[i] = -hs[order0[i]]
        order = np.argsort(neg, kind="mergesort")  # stable: equal scores stay in document order
        for r in range(m):
            o = order0[order[r]]
            out_docs[qi, r] = hd[o]
            out_scores[qi, r] = hs[o]
        counts[qi] = m
    return out_docs, out_scores, counts


class BM25Builder:
    """Accumulates tokenized documents; :meth:`finish` turns them into a :class:`BM25Index`."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self._terms = array("i")
        self._tfs = array("i")
        self._doc_len = array("i")
        self._n_unique = array("i")

    def add(self, tokens: list[str]) -> None:
        counts = Counter(tokens)
        vocab = self.vocab
        self._terms.extend([vocab.setdefault(t, len(vocab)) for t in counts])
        self._tfs.extend(counts.values())
        self._doc_len.append(len(tokens))
        self._n_unique.append(len(counts))

    @property
    def n_docs(self) -> int:
        return len(self._doc_len)

    def finish(self, params: BM25Params, dtype: str = "float32") -> BM25Index:
        n_docs = self.n_docs
        terms = np.frombuffer(self._terms, dtype=np.int32)
        docs = np.repeat(np.arange(n_docs, dtype=np.int32), np.frombuffer(self._n_unique, dtype=np.int32))
        order = np.argsort(terms, kind="stable")  # by term; documents stay ascending within a term
        df = np.bincount(terms, minlength=len(self.vocab))
        indptr = np.zeros(len(self.vocab) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        vocab = list(self.vocab)
        post_doc = docs[order]
        post_tf = np.frombuffer(self._tfs, dtype=np.int32)[order]
        del order, docs
        doc_len = np.frombuffer(self._doc_len, dtype=np.int32).copy()
        index = BM25Index(vocab, indptr, post_doc, post_tf, None, doc_len, params, dtype)
        self.__init__()  # free the buffers
        return index


class BM25Index(Searcher):
    """CSC BM25 postings over ``n_docs`` documents; see the module docstring."""

    def __init__(self, vocab: list[str] | dict[str, int], indptr: np.ndarray, post_doc: np.ndarray,
                 post_tf: np.ndarray, post_score: np.ndarray | None, doc_len: np.ndarray,
                 params: BM25Params, dtype: str = "float32"):
        self.vocab = vocab if isinstance(vocab, dict) else {t: i for i, t in enumerate(vocab)}
        self.indptr, self.post_doc, self.post_tf, self.doc_len = indptr, post_doc, post_tf, doc_len
        self.params, self.dtype = params, dtype
        self.n_docs = int(doc_len.size)
        self.avgdl = float(doc_len.sum() / self.n_docs) if self.n_docs else 0.0
        self.post_score = post_score if post_score is not None else self.compute_scores(params)
        self.positive = self.idf() > 0  # terms whose postings all score > 0 (dense search path)

    @classmethod
    def build(cls, token_lists: Iterable[list[str]], params: BM25Params | None = None,
              dtype: str = "float32") -> BM25Index:
        b = BM25Builder()
        for toks in token_lists:
            b.add(toks)
        return b.finish(params or BM25Params(), dtype)

    # -- scoring ---------------------------------------------------------------------------
    @property
    def df(self) -> np.ndarray:
        return np.diff(self.indptr)

    def idf(self, params: BM25Params | None = None) -> np.ndarray:
        return idf(self.df, self.n_docs, params or self.params)

    def compute_scores(self, params: BM25Params) -> np.ndarray:
        """Every posting's BM25 contribution under ``params`` (from tf, df, lengths)."""
        if self.n_docs == 0 or self.avgdl == 0:
            return np.zeros(self.post_doc.size, dtype=self.dtype)
        w = term_weight(self.post_tf, np.asarray(self.doc_len)[self.post_doc], self.avgdl, params)
        w *= np.repeat(self.idf(params), self.df)
        return w.astype(self.dtype, copy=False)

    def with_params(self, params: BM25Params) -> BM25Index:
        """This index scored with other k1/b/IDF (recomputed in memory when they differ)."""
        if params == self.params:
            return self
        return BM25Index(self.vocab, self.indptr, self.post_doc, self.post_tf, None, self.doc_len, params,
                         self.dtype)

    def term_ids(self, tokens: list[str]) -> list[int]:
        """Term ids of ``tokens`` in order, duplicates kept, unknown terms dropped."""
        v = self.vocab
        return [v[t] for t in tokens if t in v]

    def get_scores(self, query: list[str]) -> np.ndarray:
        acc = np.zeros(self.n_docs, dtype=np.float64)
        for t in self.term_ids(query):
            s, e = self.indptr[t], self.indptr[t + 1]
            acc[self.post_doc[s:e]] += self.post_score[s:e]
        return acc

    def search(self, queries: list[list[str]], k: int) -> SearchResult:
        ids = [self.term_ids(q) for q in queries]
        q_ptr = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in ids], out=q_ptr[1:])
        q_terms = np.fromiter((t for x in ids for t in x), dtype=np.int64, count=int(q_ptr[-1]))
        docs, scores, counts = _search_batch(q_ptr, q_terms, np.asarray(self.indptr), np.asarray(self.post_doc),
                                             np.asarray(self.post_score), self.positive, self.n_docs,
                                             max(int(k), 1))
        return SearchResult(docs, scores, counts)

    # -- persistence -----------------------------------------------------------------------
    def stats(self) -> dict:
        return {"docs": self.n_docs, "terms": len(self.vocab), "postings": int(self.post_doc.size),
                "avgdl": self.avgdl, "dtype": self.dtype}

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "vocab.json").write_text(json.dumps(list(self.vocab), ensure_ascii=False))
        for name, arr in (("indptr", self.indptr), ("post_doc", self.post_doc), ("post_tf", self.post_tf),
                          ("post_score", self.post_score), ("doc_len", self.doc_len)):
            np.save(d / f"{name}.npy", np.ascontiguousarray(arr))
        (d / "bm25.json").write_text(json.dumps({"params": self.params.as_dict(), **self.stats()}, indent=2))

    @classmethod
    def load(cls, directory: str | Path, mmap: bool = True) -> BM25Index:
        d = Path(directory)
        meta = json.loads((d / "bm25.json").read_text())
        mode = "r" if mmap else None
        arrs = {n: np.load(d / f"{n}.npy", mmap_mode=mode) for n in
                ("indptr", "post_doc", "post_tf", "post_score", "doc_len")}
        vocab = json.loads((d / "vocab.json").read_text())
        return cls(vocab, arrs["indptr"], arrs["post_doc"], arrs["post_tf"], arrs["post_score"], arrs["doc_len"],
                   BM25Params(**meta["params"]), meta["dtype"])
