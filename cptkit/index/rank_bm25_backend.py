"""The reference backend: ``rank_bm25.BM25Okapi`` behind the :class:`Searcher` interface.

Slow (a Python dict per document, every query scores every document): for small corpora and
for checking the fast backend. ``idf=okapi`` is ``BM25Okapi`` unchanged; ``idf=lucene``
replaces only its IDF with Lucene's ``log(1 + (N − n + 0.5)/(n + 0.5))``.
"""

from __future__ import annotations

import math

import numpy as np
from rank_bm25 import BM25Okapi

from cptkit.index.base import BM25Params, Searcher, SearchResult, topk_dense


class _BM25Lucene(BM25Okapi):
    """BM25Okapi with Lucene's IDF (never negative, so no epsilon floor)."""

    def _calc_idf(self, nd: dict) -> None:
        for word, freq in nd.items():
            self.idf[word] = math.log(1.0 + (self.corpus_size - freq + 0.5) / (freq + 0.5))
        self.average_idf = sum(self.idf.values()) / max(len(self.idf), 1)


class RankBM25Searcher(Searcher):
    """rank_bm25 over already tokenized documents."""

    def __init__(self, token_lists: list[list[str]], params: BM25Params | None = None):
        self.params = params or BM25Params()
        p = self.params
        if p.idf == "okapi":
            self.model = BM25Okapi(token_lists, k1=p.k1, b=p.b, epsilon=p.epsilon)
        else:
            self.model = _BM25Lucene(token_lists, k1=p.k1, b=p.b)
        self.n_docs = len(token_lists)

    def get_scores(self, query: list[str]) -> np.ndarray:
        return np.asarray(self.model.get_scores(query), dtype=np.float64)

    def search(self, queries: list[list[str]], k: int) -> SearchResult:
        k = max(int(k), 1)
        docs = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.zeros((len(queries), k), dtype=np.float64)
        counts = np.zeros(len(queries), dtype=np.int64)
        freqs = self.model.doc_freqs
        for qi, q in enumerate(queries):
            terms = set(q)
            matched = np.fromiter((not terms.isdisjoint(f) for f in freqs), dtype=bool, count=self.n_docs)
            d, s = topk_dense(self.get_scores(q), matched, k)
            docs[qi, :d.size], scores[qi, :d.size], counts[qi] = d, s, d.size
        return SearchResult(docs, scores, counts)
