"""The fast in-process BM25 backend: CSC postings in ``.npy`` files, searched by a numba kernel.

Layout of an index directory (all arrays memory-mapped on load):

* ``vocab.json``: the terms, in term-id order.
* ``indptr.npy`` (int64, terms + 1): term ``t``'s postings are ``[indptr[t], indptr[t+1])``.
* ``post_doc.npy`` (int32), ``post_tf.npy`` (int32): document index and term frequency, by term
  then document.
* ``post_score.npy`` (float32 or float64): the precomputed BM25 contribution of each posting,
  ``IDF(t) · tf (k1 + 1) / (tf + k1 (1 − b + b |d| / avgdl))``.
* ``doc_len.npy`` (int32): document lengths in tokens. ``bm25.json``: parameters and stats.

Building counts postings in two passes over the documents' term ids (document frequencies, then
a fill), so documents come out ascending within a term with no sort.

Searching is pure gather-add: each distinct query term adds its postings' precomputed scores
(times the term's count in the query) into a dense accumulator (float32 for float32 postings,
like bm25s). Queries whose terms have many postings (≥ N/8) run ``GROUP`` at a time through the
documents in blocks of ``BLOCK_DOCS``: per block and query, every term, in query order (so the
float sums are those of one pass over all documents), adds its scores in the block to a
block-sized accumulator that stays in cache: a term in ≥ N/``DENSE_FRACTION`` documents (at most
``DENSE_MAX_TERMS``, built in memory on first search) from a dense score column, 0 where it is
absent, which vectorises; any other from its postings in the block (a cursor per term, postings
being sorted by document). The block is then scanned in chunks of ``SCAN_CHUNK`` entries: a
chunk whose maximum is not above the query's floor is skipped whole, the others append their
documents above it to the query's candidate buffer, which a partial selection (quickselect, an
``np.argpartition`` equivalent) cuts back to k whenever it fills, raising the floor. The group's
queries share the block's postings and columns of their common terms while those are in cache.
Rare-term queries (and those with an IDF ≤ 0) collect the touched documents instead, so their
cost is O(postings) however large N is. Only the k selected are sorted, by score descending,
then lower document index. A whole batch of queries runs inside one numba call;
``search(reference=True)`` runs the plain kernel (one accumulator over all N from the postings,
scanned entry by entry), which returns the same documents and scores. Only documents containing
a query term are returned.
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

BLOCK_DOCS = 32768  # documents per accumulator block (float32: 128 KiB, stays in L2)
GROUP = 64  # dense queries that walk the blocks together (sharing the block's postings in cache)
DENSE_FRACTION = 8  # terms in >= 1/8 of the documents are added from dense score columns
DENSE_MAX_TERMS = 32  # at most this many (memory: 4 bytes x documents each for float32)
SCAN_CHUNK = 64  # accumulator entries per scan chunk skipped as a whole when none beats the floor
FILES = ("vocab.json", "indptr.npy", "post_doc.npy", "post_tf.npy", "post_score.npy", "doc_len.npy", "bm25.json")


@njit(cache=True)
def _kth_largest(vals, n, k):  # pragma: no cover - numba
    """The ``k``-th largest of ``vals[:n]`` (1 <= k <= n); reorders ``vals[:n]`` (quickselect)."""
    lo, hi, target = 0, n - 1, n - k  # ascending position of the k-th largest
    while lo < hi:
        mid = (lo + hi) >> 1
        a, b, c = vals[lo], vals[mid], vals[hi]  # median of three as pivot
        pivot = b if (a <= b <= c or c <= b <= a) else (a if (b <= a <= c or c <= a <= b) else c)
        i, j = lo, hi
        while i <= j:
            while vals[i] < pivot:
                i += 1
            while vals[j] > pivot:
                j -= 1
            if i <= j:
                vals[i], vals[j] = vals[j], vals[i]
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break
    return vals[target]


@njit(cache=True)
def _select(cs, cd, n, k, scratch):  # pragma: no cover - numba
    """Keep the best ``k`` of the candidates ``(cs[:n], cd[:n])`` in place, by score desc then doc asc.

    Partial selection (an ``np.argpartition`` equivalent): the k-th largest score ``t`` by
    quickselect, then every candidate above ``t`` and the lowest-index documents tied at ``t``.
    The kept candidates stay in their relative order. Returns ``(m, t)``: count kept, threshold.
    """
    if n <= k:
        return n, -np.inf
    for i in range(n):
        scratch[i] = cs[i]
    t = _kth_largest(scratch, n, k)
    above = 0
    for i in range(n):
        above += cs[i] > t
    need = k - above  # >= 1 candidates tied at t to keep: the lowest document indices
    dmax = np.iinfo(np.int64).max
    n_tied = 0
    for i in range(n):
        n_tied += cs[i] == t
    if n_tied > need:
        tied = np.empty(n_tied, np.int64)
        j = 0
        for i in range(n):
            if cs[i] == t:
                tied[j] = cd[i]
                j += 1
        tied.sort()
        dmax = tied[need - 1]
    m = 0
    for i in range(n):
        v = cs[i]
        if v > t or (v == t and cd[i] <= dmax):
            cs[m], cd[m] = v, cd[i]
            m += 1
    return m, t


@njit(cache=True)
def _query_stats(q_ptr, q_terms, indptr, positive, qi):  # pragma: no cover - numba
    """``(postings, all IDF > 0)`` of query ``qi``."""
    n_post = 0
    all_pos = True
    for j in range(q_ptr[qi], q_ptr[qi + 1]):
        t = q_terms[j]
        n_post += indptr[t + 1] - indptr[t]
        all_pos = all_pos and positive[t]
    return n_post, all_pos


@njit(cache=True)
def _sparse_candidates(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, qi, acc, seen, cs, cd):  # pragma: no cover
    """Score the documents query ``qi`` touches into ``(cs, cd)`` in document order; returns their count.

    ``acc`` (zero over all documents) and ``seen`` (all False) are left as found. Exact whatever the
    signs of the scores."""
    c = 0
    for j in range(q_ptr[qi], q_ptr[qi + 1]):
        t = q_terms[j]
        w = q_weight[j]
        for p in range(indptr[t], indptr[t + 1]):
            d = post_doc[p]
            if not seen[d]:
                seen[d] = True
                cd[c] = d
                c += 1
            acc[d] += post_score[p] * w
    cd[:c].sort()  # index order, so that ties keep the lower document
    for i in range(c):
        d = cd[i]
        cs[i] = np.float64(acc[d])
        acc[d] = 0.0
        seen[d] = False
    return c


@njit(cache=True)
def _emit(cs, cd, n, k, scratch, out_docs, out_scores, counts, qi):  # pragma: no cover - numba
    """Select the top ``k`` of ``n`` candidates (in document order) into row ``qi`` of the outputs."""
    m, _ = _select(cs, cd, n, k, scratch)
    order = np.argsort(-cs[:m], kind="mergesort")  # stable: candidates are in document order
    for r in range(m):
        o = order[r]
        out_docs[qi, r] = cd[o]
        out_scores[qi, r] = cs[o]
    counts[qi] = m


@njit(cache=True)
def _lower_bound(a, lo, hi, x):  # pragma: no cover - numba
    """The first ``p`` in ``[lo, hi)`` with ``a[p] >= x`` (``a[lo:hi]`` ascending), else ``hi``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, fastmath=True, inline="always")
def _chunk_max(a):  # pragma: no cover - numba
    """``max(a)`` (``a`` not empty), vectorised: exact, as a max does not round (scores are never NaN)."""
    m = a[0]
    for i in range(1, a.size):
        m = max(m, a[i])
    return m


@njit(cache=True)
def _add_block(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, dense_col, cols, qi, lo, hi, cur,
               acc):  # pragma: no cover - numba
    """Add query ``qi``'s scores of documents ``[lo, hi)`` into ``acc[:hi - lo]``, terms in query order:
    a dense-column term from its column (adding 0 where it is absent leaves a sum unchanged), any
    other from its postings in the block, ``cur[j]`` being term ``j``'s next posting."""
    m = hi - lo
    for j in range(q_ptr[qi], q_ptr[qi + 1]):
        t = q_terms[j]
        w = q_weight[j]
        if dense_col[t] >= 0:
            col = cols[dense_col[t], lo:hi]  # a view indexed from 0 vectorises
            if w == 1:
                for i in range(m):
                    acc[i] += col[i]
            else:
                for i in range(m):
                    acc[i] += col[i] * w
            continue
        p0 = cur[j]
        p1 = _lower_bound(post_doc, p0, indptr[t + 1], hi)
        cur[j] = p1
        if w == 1:
            for p in range(p0, p1):
                acc[post_doc[p] - lo] += post_score[p]
        else:
            for p in range(p0, p1):
                acc[post_doc[p] - lo] += post_score[p] * w


@njit(cache=True)
def _scan_block(acc, m, lo, chunk, cs, cd, n, floor, cap, k, scratch):  # pragma: no cover - numba
    """Append the documents of ``acc[:m]`` (document ``lo + i``) scoring above ``floor`` to the
    candidates ``(cs, cd)[:n]``, cut back to k whenever ``cap`` are held; a chunk whose max is not
    above the floor is skipped whole (touched <=> score > 0). Returns ``(n, floor)``."""
    fl = acc.dtype.type(floor)  # exact: the floor is a score of this dtype (or 0)
    for c0 in range(0, m, chunk):
        c1 = min(c0 + chunk, m)
        if _chunk_max(acc[c0:c1]) <= fl:
            continue
        for i in range(c0, c1):
            v = np.float64(acc[i])
            if v > floor:
                cs[n], cd[n] = v, lo + i
                n += 1
                if n == cap:
                    n, floor = _select(cs, cd, n, k, scratch)
                    fl = acc.dtype.type(floor)
    return n, floor


@njit(cache=True, nogil=True)
def _search_batch(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, positive, n_docs, k,
                  block, chunk, group, dense_col, cols):  # pragma: no cover - numba
    """Top-k of every query: (docs, scores, counts); dense queries ``group`` at a time, blocked by
    ``block`` documents; term ``t`` with ``dense_col[t] >= 0`` added from the dense column
    ``cols[dense_col[t]]`` (its postings' scores, 0 elsewhere). See the module docstring."""
    nq = q_ptr.size - 1
    out_docs = np.full((nq, k), -1, np.int64)
    out_scores = np.zeros((nq, k), np.float64)
    counts = np.zeros(nq, np.int64)
    block = max(1, min(block, n_docs))
    chunk = max(1, min(chunk, block))
    acc = np.zeros(max(n_docs, 1), post_score.dtype)  # float32 postings sum in float32 (like bm25s)
    seen = np.zeros(n_docs, np.bool_)
    cap = min(n_docs, max(4 * k, 4096))  # dense path: candidate buffer, compacted to k when full
    cs = np.empty(n_docs, np.float64)
    cd = np.empty(n_docs, np.int64)
    scratch = np.empty(n_docs, np.float64)
    dense = np.zeros(nq, np.bool_)
    for qi in range(nq):
        n_post, all_pos = _query_stats(q_ptr, q_terms, indptr, positive, qi)
        if n_post == 0:
            continue
        if all_pos and n_post * 8 >= n_docs:
            dense[qi] = True
        else:
            n = _sparse_candidates(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, qi, acc, seen, cs, cd)
            _emit(cs, cd, n, k, scratch, out_docs, out_scores, counts, qi)
    # Dense queries, a group at a time: per block of documents, per query of the group, gather-add
    # every term's postings in the block into acc[:block] (terms in query order: the same float sums
    # as one pass over all documents), then scan it into the query's own candidate buffer. The group's
    # queries share the block's postings of their common terms while those are in cache.
    dq = np.nonzero(dense)[0]
    g = max(1, min(group, dq.size, (1 << 22) // max(cap, 1)))
    gs = np.empty((g, cap), np.float64)
    gd = np.empty((g, cap), np.int64)
    gn = np.zeros(g, np.int64)
    gfloor = np.zeros(g, np.float64)
    cur = np.empty(q_terms.size, np.int64)  # per query term: its next posting
    for g0 in range(0, dq.size, g):
        ng = min(g, dq.size - g0)
        for b in range(ng):
            qi = dq[g0 + b]
            for j in range(q_ptr[qi], q_ptr[qi + 1]):
                cur[j] = indptr[q_terms[j]]
            gn[b] = 0
            gfloor[b] = 0.0  # documents come in index order: a later one loses ties, so strictly greater
        for lo in range(0, n_docs, block):
            hi = min(lo + block, n_docs)
            m = hi - lo
            for b in range(ng):  # gather-add the block, then scan it into the query's candidates
                qi = dq[g0 + b]
                _add_block(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, dense_col, cols, qi, lo, hi,
                           cur, acc)
                n, floor = _scan_block(acc, m, lo, chunk, gs[b], gd[b], gn[b], gfloor[b], cap, k, scratch)
                gn[b], gfloor[b] = n, floor
                acc[:m] = 0.0
        for b in range(ng):
            _emit(gs[b], gd[b], gn[b], k, scratch, out_docs, out_scores, counts, dq[g0 + b])
    return out_docs, out_scores, counts


@njit(cache=True, nogil=True)
def _search_batch_reference(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, positive, n_docs,
                            k):  # pragma: no cover - numba
    """:func:`_search_batch` unblocked (one accumulator over all documents, a plain scan): the reference."""
    nq = q_ptr.size - 1
    out_docs = np.full((nq, k), -1, np.int64)
    out_scores = np.zeros((nq, k), np.float64)
    counts = np.zeros(nq, np.int64)
    acc = np.zeros(n_docs, post_score.dtype)
    seen = np.zeros(n_docs, np.bool_)
    cap = min(n_docs, max(4 * k, 4096))
    cs = np.empty(n_docs, np.float64)
    cd = np.empty(n_docs, np.int64)
    scratch = np.empty(n_docs, np.float64)
    for qi in range(nq):
        n_post, all_pos = _query_stats(q_ptr, q_terms, indptr, positive, qi)
        if n_post == 0:
            continue
        n = 0
        if all_pos and n_post * 8 >= n_docs:
            for j in range(q_ptr[qi], q_ptr[qi + 1]):
                t = q_terms[j]
                w = q_weight[j]
                if w == 1:
                    for p in range(indptr[t], indptr[t + 1]):
                        acc[post_doc[p]] += post_score[p]
                else:
                    for p in range(indptr[t], indptr[t + 1]):
                        acc[post_doc[p]] += post_score[p] * w
            floor = 0.0
            for d in range(n_docs):
                v = np.float64(acc[d])
                acc[d] = 0.0
                if v > floor:
                    cs[n], cd[n] = v, d
                    n += 1
                    if n == cap:
                        n, floor = _select(cs, cd, n, k, scratch)
        else:
            n = _sparse_candidates(q_ptr, q_terms, q_weight, indptr, post_doc, post_score, qi, acc, seen, cs, cd)
        _emit(cs, cd, n, k, scratch, out_docs, out_scores, counts, qi)
    return out_docs, out_scores, counts


@njit(cache=True)
def _postings(ids, doc_len, n_terms):  # pragma: no cover - numba
    """CSC postings of token-id documents (``ids`` concatenated, ``doc_len`` tokens each):
    ``(indptr, post_doc, post_tf)``, documents ascending within a term (two counting passes)."""
    last = np.full(n_terms, -1, np.int32)  # the last document seen per term
    df = np.zeros(n_terms, np.int64)
    i = 0
    for d in range(doc_len.size):
        for _ in range(doc_len[d]):
            t = ids[i]
            i += 1
            if last[t] != d:
                last[t] = d
                df[t] += 1
    indptr = np.zeros(n_terms + 1, np.int64)
    for t in range(n_terms):
        indptr[t + 1] = indptr[t] + df[t]
    post_doc = np.empty(indptr[n_terms], np.int32)
    post_tf = np.zeros(indptr[n_terms], np.int32)
    fill = indptr[:-1].copy()  # next free slot per term
    last[:] = -1
    i = 0
    for d in range(doc_len.size):
        for _ in range(doc_len[d]):
            t = ids[i]
            i += 1
            if last[t] != d:
                last[t] = d
                post_doc[fill[t]] = d
                fill[t] += 1
            post_tf[fill[t] - 1] += 1
    return indptr, post_doc, post_tf


class BM25Builder:
    """Accumulates tokenized documents (as term ids); :meth:`finish` turns them into a :class:`BM25Index`."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self._ids = array("i")
        self._doc_len = array("i")

    def add(self, tokens: list[str]) -> None:
        vocab = self.vocab
        self._ids.extend([vocab.setdefault(t, len(vocab)) for t in tokens])
        self._doc_len.append(len(tokens))

    @property
    def n_docs(self) -> int:
        return len(self._doc_len)

    def finish(self, params: BM25Params, dtype: str = "float32") -> BM25Index:
        doc_len = np.frombuffer(self._doc_len, dtype=np.int32).copy()
        indptr, post_doc, post_tf = _postings(np.frombuffer(self._ids, dtype=np.int32), doc_len, len(self.vocab))
        index = BM25Index(list(self.vocab), indptr, post_doc, post_tf, None, doc_len, params, dtype)
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
        self._dense: tuple | None = None  # (min_df, dense_col, cols) of dense_columns

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

    def query_arrays(self, queries: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR form of a batch of queries: ``(q_ptr, term ids, weights)``, each term once per query.

        A term's weight is its count in the query (in the postings' dtype): a repeated query term
        adds its postings' scores times the count instead of once per occurrence."""
        ids = [Counter(self.term_ids(q)) for q in queries]
        q_ptr = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in ids], out=q_ptr[1:])
        n = int(q_ptr[-1])
        q_terms = np.fromiter((t for x in ids for t in x), dtype=np.int64, count=n)
        q_weight = np.fromiter((c for x in ids for c in x.values()), dtype=self.post_score.dtype, count=n)
        return q_ptr, q_terms, q_weight

    def dense_columns(self, min_df: int) -> tuple[np.ndarray, np.ndarray]:
        """``(dense_col, cols)``: the (at most ``DENSE_MAX_TERMS``) terms in >= ``min_df`` documents as
        dense score columns (0 where absent), ``dense_col[t]`` the row of term ``t`` or -1; cached."""
        key = int(min_df)
        if self._dense is None or self._dense[0] != key:
            df = self.df
            terms = np.flatnonzero(df >= max(key, 1))
            terms = terms[np.argsort(-df[terms], kind="stable")][:DENSE_MAX_TERMS]
            dense_col = np.full(df.size, -1, np.int32)
            dense_col[terms] = np.arange(terms.size, dtype=np.int32)
            cols = np.zeros((terms.size, self.n_docs), self.post_score.dtype)
            for i, t in enumerate(terms):
                s, e = self.indptr[t], self.indptr[t + 1]
                cols[i, self.post_doc[s:e]] = self.post_score[s:e]
            self._dense = (key, dense_col, cols)
        return self._dense[1], self._dense[2]

    def search(self, queries: list[list[str]], k: int, *, block: int = BLOCK_DOCS, chunk: int = SCAN_CHUNK,
               group: int = GROUP, dense_min_df: int | None = None, reference: bool = False) -> SearchResult:
        """Top-``k`` documents of each query (score desc, then lower index); see the module docstring.

        ``block``/``chunk``/``group``/``dense_min_df``: documents per accumulator block, per skippable
        scan chunk, dense queries walked through the blocks together, and the document frequency from
        which a term is added as a dense column (default ``N / DENSE_FRACTION``); results do not depend
        on them. ``reference``: the unblocked kernel instead (same results, for tests and benches)."""
        q_ptr, q_terms, q_weight = self.query_arrays(queries)
        args = (q_ptr, q_terms, q_weight, np.asarray(self.indptr), np.asarray(self.post_doc),
                np.asarray(self.post_score), self.positive, self.n_docs, max(int(k), 1))
        if reference:
            docs, scores, counts = _search_batch_reference(*args)
        else:
            min_df = -(-self.n_docs // DENSE_FRACTION) if dense_min_df is None else dense_min_df
            docs, scores, counts = _search_batch(*args, int(block), int(chunk), int(group),
                                                 *self.dense_columns(min_df))
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
