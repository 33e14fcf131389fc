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
accumulator, then takes the top k of the touched documents with a partial sort (threshold by
``np.partition``, exact ties resolved by document index). Cost: O(postings of the query terms).
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


@njit(cache=True, nogil=True)
def _search_batch(q_ptr, q_terms, indptr, post_doc, post_score, n_docs, k):  # pragma: no cover - numba
    nq = q_ptr.size - 1
    out_docs = np.full((nq, k), -1, np.int64)
    out_scores = np.zeros((nq, k), np.float64)
    counts = np.zeros(nq, np.int64)
    acc = np.zeros(n_docs, np.float64)
    seen = np.zeros(n_docs, np.bool_)
    touched = np.empty(n_docs, np.int64)
    for qi in range(nq):
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
        if c == 0:
            continue
        cs = np.empty(c, np.float64)
        for i in range(c):
            cs[i] = acc[touched[i]]
        if c > k:
            th = np.partition(cs, c - k)[c - k]  # the k-th largest score
            sel = np.empty(k, np.int64)
            g = 0
            n_tie = 0
            for i in range(c):
                if cs[i] > th:
                    sel[g] = touched[i]
                    g += 1
                elif cs[i] == th:
                    n_tie += 1
            ties = np.empty(n_tie, np.int64)
            n_tie = 0
            for i in range(c):
                if cs[i] == th:
                    ties[n_tie] = touched[i]
                    n_tie += 1
            ties.sort()
            for i in range(k - g):
                sel[g + i] = ties[i]
            m = k
        else:
            sel = touched[:c].copy()
            m = c
        sel.sort()  # document order, so the stable sort below breaks ties by document index
        ss = np.empty(m, np.float64)
        for i in range(m):
            ss[i] = -acc[sel[i]]
        order = np.argsort(ss, kind="mergesort")
        for r in range(m):
            out_docs[qi, r] = sel[order[r]]
            out_scores[qi, r] = -ss[order[r]]
        counts[qi] = m
        for i in range(c):
            acc[touched[i]] = 0.0
            seen[touched[i]] = False
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
                                             np.asarray(self.post_score), self.n_docs, max(int(k), 1))
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
