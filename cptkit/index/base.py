"""The BM25 search interface shared by backends, and the scoring formulas as pure functions.

Score of document ``d`` for query terms ``q_1..q_m`` (duplicates count once per occurrence,
as in ``rank_bm25``)::

    score(d) = sum_i IDF(q_i) * tf(q_i, d) * (k1 + 1) / (tf(q_i, d) + k1 * (1 - b + b * |d| / avgdl))

IDF variants (``n`` = documents containing the term, ``N`` = documents):

* ``okapi``: ``log((N - n + 0.5) / (n + 0.5))``; negative values (terms in more than half the
  documents) are replaced by ``epsilon * mean IDF`` (mean over all terms before the
  replacement), exactly as ``rank_bm25.BM25Okapi``.
* ``lucene``: ``log(1 + (N - n + 0.5) / (n + 0.5))``, never negative (Lucene/Elasticsearch, bm25s).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.text.tokenize import Tokenizer

IDF_VARIANTS = ("lucene", "okapi")
# k1 when none is given, per IDF variant: lucene = Elasticsearch's BM25 similarity defaults
# (k1 1.2, b 0.75; the engine Retrieve-from-CC used), okapi = rank_bm25.BM25Okapi's (k1 1.5, b 0.75).
DEFAULT_K1 = {"lucene": 1.2, "okapi": 1.5}


@dataclass(frozen=True)
class BM25Params:
    """BM25 parameters: ``k1``, ``b``, the IDF variant and okapi's ``epsilon``.

    ``k1=None`` takes the variant's default (:data:`DEFAULT_K1`): 1.2 for ``lucene``, 1.5 for ``okapi``.
    """

    k1: float = None  # type: ignore[assignment]  # None -> DEFAULT_K1[idf] (set in __post_init__)
    b: float = 0.75
    idf: str = "lucene"
    epsilon: float = 0.25

    def __post_init__(self) -> None:
        if self.idf not in IDF_VARIANTS:
            raise ValueError(f"idf must be one of {IDF_VARIANTS}, got {self.idf!r}")
        if self.k1 is None:
            object.__setattr__(self, "k1", DEFAULT_K1[self.idf])
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")

    def as_dict(self) -> dict:
        return {"k1": self.k1, "b": self.b, "idf": self.idf, "epsilon": self.epsilon}


def idf_lucene(df: np.ndarray, n_docs: int) -> np.ndarray:
    """Lucene IDF: ``log(1 + (N - n + 0.5) / (n + 0.5))``."""
    df = np.asarray(df, dtype=np.float64)
    return np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def idf_okapi(df: np.ndarray, n_docs: int, epsilon: float = 0.25) -> np.ndarray:
    """rank_bm25's Okapi IDF: ``log(N - n + 0.5) - log(n + 0.5)``, negatives → ``epsilon`` · mean."""
    df = np.asarray(df, dtype=np.float64)
    idf = np.log(n_docs - df + 0.5) - np.log(df + 0.5)
    if idf.size:
        idf[idf < 0] = epsilon * (idf.sum() / idf.size)
    return idf


def idf(df: np.ndarray, n_docs: int, params: BM25Params) -> np.ndarray:
    return idf_okapi(df, n_docs, params.epsilon) if params.idf == "okapi" else idf_lucene(df, n_docs)


def term_weight(tf: np.ndarray, doc_len: np.ndarray, avgdl: float, params: BM25Params) -> np.ndarray:
    """The TF part ``tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))`` (float64)."""
    tf = np.asarray(tf, dtype=np.float64)
    norm = params.k1 * (1.0 - params.b + params.b * np.asarray(doc_len, dtype=np.float64) / avgdl)
    return tf * (params.k1 + 1.0) / (tf + norm)


@dataclass
class SearchResult:
    """Top-k of a batch of queries: ``docs[q, r]`` (document index, -1 past ``counts[q]``), ``scores[q, r]``."""

    docs: np.ndarray
    scores: np.ndarray
    counts: np.ndarray

    def hits(self, q: int) -> list[tuple[int, float]]:
        n = int(self.counts[q])
        return list(zip(self.docs[q, :n].tolist(), self.scores[q, :n].tolist(), strict=True))


def topk_dense(scores: np.ndarray, matched: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference top-k: documents with ``matched`` true, by score desc then document index."""
    idx = np.flatnonzero(matched)
    order = np.lexsort((idx, -scores[idx]))[:k]
    return idx[order], scores[idx[order]]


class Searcher(ABC):
    """A BM25 index over ``n_docs`` documents, searched with token lists.

    Only documents containing at least one query term are returned, ranked by score
    (descending), ties broken by document index (ascending); a query may get fewer than k.
    """

    params: BM25Params
    n_docs: int

    @abstractmethod
    def search(self, queries: list[list[str]], k: int) -> SearchResult:
        """Top-``k`` documents of every query."""

    @abstractmethod
    def get_scores(self, query: list[str]) -> np.ndarray:
        """Scores of all documents for one query (float64, length ``n_docs``)."""


def bm25_params(rc: Any) -> BM25Params:
    """The BM25 parameters of a typed ``retrieve`` config section (one-line error when invalid).

    ``rc.k1`` None takes the variant's default (:data:`DEFAULT_K1`)."""
    try:
        return BM25Params(k1=rc.k1, b=rc.b, idf=rc.idf, epsilon=rc.epsilon)
    except ValueError as e:
        raise CptkitError(f"retrieve: {e}") from None


def bm25_tokenizer(rc: Any) -> Any:
    """The :class:`cptkit.text.tokenize.Tokenizer` of a ``retrieve`` config section (typed or a node)."""
    from omegaconf import OmegaConf

    cfg = rc.tokenizer
    if OmegaConf.is_config(cfg):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    try:
        return Tokenizer(cfg)
    except (ValueError, TypeError) as e:
        raise CptkitError(f"retrieve.tokenizer: {e}") from None
