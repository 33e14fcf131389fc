"""BM25 + RM3 pseudo-relevance feedback as pure functions (Lavrenko & Croft's relevance model RM1,
interpolated with the original query: RM3, Abdul-Jaleel et al., TREC 2004), as Anserini's
``Rm3Reranker`` computes it (defaults: 10 feedback documents, 10 terms, original query weight 0.5).

Given the query's top ``fb_docs`` documents ``D`` with retrieval scores ``s(D)``:

1. each document's term vector: the counts ``tf(w, D)`` of its terms ``w`` that are 2 to 20
   characters of ``[a-z0-9]`` and occur in at most ``max_df_ratio`` (0.1) of the collection's
   documents (Anserini's stopword rule), pruned to its ``fb_terms`` most frequent terms;
2. ``P(w|D) = tf(w, D) / Σ_v tf(v, D)`` over that pruned vector;
3. RM1: ``P(w|R) ∝ Σ_D P(w|D) · s(D)``, its ``fb_terms`` heaviest terms kept and scaled to sum 1;
4. RM3: ``w_q · q(w) + (1 − w_q) · P(w|R)``, ``q`` the query's term counts scaled to sum 1.

Ties are broken by the term (ascending), as Lucene's term order does. :func:`rm3_queries` extends
this to ``n`` queries (the control of a sweep that compares query sets of equal size): query ``j``
interpolates the query with the ``j``-th block of ``fb_terms`` terms of the same relevance model
(block 1 is RM3 itself). :func:`weighted_text` writes a weighted query as text for a BM25 that counts a
repeated query term once per occurrence (``cptkit retrieve``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cptkit.core.errors import CptkitError

_TERM = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class RM3Params:
    """Anserini's RM3 settings (``-rm3 -rm3.fbDocs 10 -rm3.fbTerms 10 -rm3.originalQueryWeight 0.5``)
    and its feedback-term filter."""

    fb_docs: int = 10
    fb_terms: int = 10
    original_query_weight: float = 0.5
    max_df_ratio: float = 0.1  # a term in more of the collection's documents is never an expansion term
    min_term_length: int = 2
    max_term_length: int = 20

    def __post_init__(self) -> None:
        if self.fb_docs < 1 or self.fb_terms < 1:
            raise CptkitError(f"rm3: fb_docs and fb_terms must be >= 1, got {self.fb_docs}, {self.fb_terms}")
        if not 0.0 <= self.original_query_weight <= 1.0:
            raise CptkitError(f"rm3: original_query_weight must be in [0, 1], got {self.original_query_weight}")
        if not 0.0 < self.max_df_ratio <= 1.0:
            raise CptkitError(f"rm3: max_df_ratio must be in (0, 1], got {self.max_df_ratio}")


def _top(weights: Mapping[str, float], n: int) -> list[tuple[str, float]]:
    """The ``n`` heaviest ``(term, weight)`` pairs, ties by term."""
    return sorted(weights.items(), key=lambda tw: (-tw[1], tw[0]))[:n]


def unit(weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` scaled to sum 1 (empty when they sum to 0)."""
    total = sum(weights.values())
    return {t: w / total for t, w in weights.items()} if total > 0 else {}


def feedback_vector(tokens: Sequence[str], df: Callable[[str], int], n_docs: int, p: RM3Params) -> dict[str, float]:
    """One feedback document's term counts after the term filter, pruned to ``p.fb_terms`` terms."""
    limit = p.max_df_ratio * n_docs
    counts = Counter(t for t in tokens if p.min_term_length <= len(t) <= p.max_term_length and _TERM.fullmatch(t))
    kept = {t: float(c) for t, c in counts.items() if df(t) <= limit}
    return dict(_top(kept, p.fb_terms))


def relevance_model(feedback: Sequence[tuple[Sequence[str], float]], df: Callable[[str], int], n_docs: int,
                    p: RM3Params = RM3Params(), n_terms: int | None = None) -> dict[str, float]:
    """RM1 from ``(document tokens, retrieval score)`` pairs, best first (the first ``p.fb_docs`` are
    used): its ``n_terms`` (default ``p.fb_terms``) heaviest terms, each weight ``Σ_D P(w|D)·s(D)``
    (not yet scaled; :func:`unit` scales a block)."""
    rm: dict[str, float] = {}
    for tokens, score in feedback[:p.fb_docs]:
        vec = feedback_vector(tokens, df, n_docs, p)
        norm = sum(vec.values())
        if norm <= 0:
            continue  # a document with no feedback term (Anserini skips it too)
        for t, c in vec.items():
            rm[t] = rm.get(t, 0.0) + c / norm * float(score)
    return dict(_top(rm, p.fb_terms if n_terms is None else n_terms))


def interpolate(query: Sequence[str], expansion: Mapping[str, float], weight: float) -> dict[str, float]:
    """``weight · q + (1 − weight) · expansion``, ``q`` the query's term counts and ``expansion``
    each scaled to sum 1; an empty expansion leaves the query alone (scaled)."""
    q, e = unit(Counter(query)), unit(expansion)
    if not e:
        return q
    if not q:
        return e
    out = {t: weight * w for t, w in q.items()}
    for t, w in e.items():
        out[t] = out.get(t, 0.0) + (1.0 - weight) * w
    return out


def rm3(query: Sequence[str], feedback: Sequence[tuple[Sequence[str], float]], df: Callable[[str], int],
        n_docs: int, p: RM3Params = RM3Params()) -> dict[str, float]:
    """The RM3 query (term -> weight, summing to 1) of ``query``'s tokens and its feedback documents."""
    return interpolate(query, relevance_model(feedback, df, n_docs, p), p.original_query_weight)


def rm3_queries(query: Sequence[str], feedback: Sequence[tuple[Sequence[str], float]], df: Callable[[str], int],
                n_docs: int, n: int, p: RM3Params = RM3Params()) -> list[dict[str, float]]:
    """``n`` weighted queries from one relevance model: query ``j`` (1-based) interpolates ``query``
    with the model's terms ranked ``(j−1)·fb_terms + 1`` to ``j·fb_terms``, scaled to sum 1, so query 1
    is :func:`rm3` itself. The model is estimated once, as for :func:`rm3` (each feedback document
    pruned to ``fb_terms`` terms), and ranks at most ``fb_docs · fb_terms`` terms; a block past its
    end is the query alone."""
    ranked = _top(relevance_model(feedback, df, n_docs, p, n_terms=p.fb_terms * max(n, 0)), p.fb_terms * max(n, 0))
    return [interpolate(query, dict(ranked[j * p.fb_terms:(j + 1) * p.fb_terms]), p.original_query_weight)
            for j in range(max(n, 0))]


def weighted_text(weights: Mapping[str, float], resolution: int = 100) -> str:
    """A weighted query as text for a BM25 that adds a term's score once per occurrence: each term
    repeated ``round(weight · resolution)`` times (terms rounding to 0 dropped; weights are kept to
    ``1 / resolution``), heaviest first."""
    if resolution < 1:
        raise CptkitError(f"rm3: resolution must be >= 1, got {resolution}")
    return " ".join(" ".join([t] * round(w * resolution)) for t, w in _top(weights, len(weights))
                    if round(w * resolution) > 0)
