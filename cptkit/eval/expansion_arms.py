"""The query sets of claim ``expansion`` (conf/reproduce/claims.yaml): per topic keyword, round 0
(the keyword alone), round 1 (its ``cptkit expand-queries`` output) and BM25 + RM3 with as many
queries as round 1 (:mod:`cptkit.index.rm3`).

``cptkit expansion-arms seeds --topics conf/reproduce/topics_v2.yaml --out seeds.jsonl``
writes one keyword seed per topic (id ``kw-SLUG``). ``cptkit expansion-arms queries
--topics T --round1 DIR --index DIR --out DIR`` writes ``DIR/method=M,keyword=SLUG.jsonl`` for M in
round0, round1, rm3 (the names of the sweep members that retrieve with them), ``DIR/_arms.json`` (the
settings and per topic the query counts and RM3 terms) and ``DIR/_SUCCESS`` last.

- round0: the seed record alone.
- round1: the expand-queries records whose ``seed_id`` is the topic's seed, in output order (the
  seed first, then its question, answer and thought).
- rm3: the seed record, then ``len(round1) − 1`` RM3 queries of the keyword: query ``j`` is the
  keyword (weight ``original_query_weight``) with the ``j``-th block of ``fb_terms`` terms of the
  relevance model of its top ``fb_docs`` BM25 documents (block 1: Anserini's RM3). Both expanded arms
  thus search with the keyword and the same number of expansion queries; only where the expansions
  come from differs (the LLM, or the corpus' own top documents). The feedback search is the index's
  BM25 with ``cptkit retrieve``'s defaults (Lucene IDF, k1 1.2, b 0.75); RM3 draws nothing at random.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.output import writing
from cptkit.core.shards import atomic_write_bytes, atomic_write_json, iter_records, resolve_inputs
from cptkit.eval.retrieval_relevance import Topic, load_topics
from cptkit.index.base import BM25Params
from cptkit.index.rm3 import RM3Params, rm3_queries, weighted_text
from cptkit.index.sharded import is_sharded
from cptkit.index.store import OpenIndex

METHODS = ("round0", "round1", "rm3")
ARMS_FILE = "_arms.json"


def member_name(method: str, keyword_slug: str) -> str:
    """A sweep member's directory name, Hydra's override_dirname form (read by :mod:`cptkit.eval.reproduce`)."""
    return f"method={method},keyword={keyword_slug}"


def seed_records(topics: list[Topic]) -> list[dict[str, Any]]:
    """One keyword seed per topic, in the file's order (the input of ``cptkit expand-queries``)."""
    return [{"id": t.seed_id, "text": t.keyword, "seed_type": "keyword", "topic": t.slug} for t in topics]


def round1_by_topic(records: list[dict[str, Any]], topics: list[Topic]) -> dict[str, list[dict[str, Any]]]:
    """The expand-queries records of each topic (by ``seed_id``), in output order; each list starts
    with the topic's seed."""
    by_seed: dict[str, list[dict[str, Any]]] = {t.seed_id: [] for t in topics}
    for r in records:
        sid = r.get("seed_id", r.get("id"))
        if sid in by_seed:
            by_seed[sid].append(r)
    out = {}
    for t in topics:
        recs = by_seed[t.seed_id]
        if not recs or recs[0].get("id") != t.seed_id:
            raise CptkitError(f"round 1 has no seed record {t.seed_id!r} first for keyword {t.keyword!r}: "
                              "expand-queries was not run on these topics' seeds")
        out[t.slug] = recs
    return out


class Feedback:
    """BM25 feedback from an index: a keyword's top documents (tokens, score) and term document frequencies."""

    def __init__(self, index_dir: Path, bm25: BM25Params | None = None):
        if is_sharded(index_dir):
            raise CptkitError(f"{index_dir}: a sharded index; RM3 feedback reads a one-piece index (cptkit retrieve --index)")
        self.index = OpenIndex(index_dir)
        self.params = bm25 or BM25Params()
        self.searcher = self.index.searcher("bm25", self.params)
        self.field = self.index.meta.get("text_field", "text")
        self._df = self.index.bm25.df

    @property
    def n_docs(self) -> int:
        return self.index.n_docs

    def df(self, term: str) -> int:
        tid = self.index.bm25.vocab.get(term)
        return 0 if tid is None else int(self._df[tid])

    def tokens(self, text: str) -> list[str]:
        return self.index.tokenizer(text)

    def top(self, query: list[str], k: int) -> list[tuple[list[str], float]]:
        """The query's top ``k`` documents as (tokens, BM25 score), best first."""
        res = self.searcher.search([query], k)
        out = []
        for d, s in res.hits(0):
            text = self.index.docs.record(d).get(self.field)
            out.append((self.tokens(text) if isinstance(text, str) else [], float(s)))
        return out

    def close(self) -> None:
        self.index.close()


def rm3_arm(topic: Topic, n_queries: int, fb: Feedback, p: RM3Params, resolution: int) -> list[dict[str, Any]]:
    """The seed and ``n_queries − 1`` RM3 queries of ``topic`` (each with its terms and weights)."""
    seed = {"id": topic.seed_id, "text": topic.keyword, "kind": "seed", "round": 0, "seed_id": topic.seed_id}
    query = fb.tokens(topic.keyword)
    feedback = fb.top(query, p.fb_docs)
    out = [seed]
    for j, weights in enumerate(rm3_queries(query, feedback, fb.df, fb.n_docs, n_queries - 1, p), 1):
        out.append({"id": f"{topic.seed_id}-rm3-{j}", "text": weighted_text(weights, resolution), "kind": "rm3",
                    "seed_id": topic.seed_id, "block": j,
                    "terms": {t: round(w, 6) for t, w in sorted(weights.items(), key=lambda tw: (-tw[1], tw[0]))}})
    return out


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def write_arms(topics: list[Topic], round1: list[dict[str, Any]], index_dir: Path, out: Path,
               p: RM3Params = RM3Params(), resolution: int = 100) -> dict[str, Any]:
    """Write every topic's three query files into ``out`` (``_SUCCESS`` last); returns ``_arms.json``."""
    with writing(out):  # _SUCCESS last
        groups = round1_by_topic(round1, topics)
        fb = Feedback(index_dir)
        try:
            per: dict[str, Any] = {}
            for t in topics:
                arms = {"round0": groups[t.slug][:1], "round1": groups[t.slug],
                        "rm3": rm3_arm(t, len(groups[t.slug]), fb, p, resolution)}
                for m in METHODS:
                    atomic_write_bytes(out / f"{member_name(m, t.slug)}.jsonl", _jsonl(arms[m]))
                per[t.slug] = {"keyword": t.keyword, "queries": {m: len(arms[m]) for m in METHODS},
                               "round1_kinds": [r.get("kind") for r in arms["round1"]],
                               "rm3_terms": [list(r["terms"]) for r in arms["rm3"][1:]]}
            summary = {"methods": list(METHODS), "rm3": asdict(p), "resolution": resolution,
                       "feedback_bm25": fb.params.as_dict(), "index": str(Path(index_dir).resolve()),
                       "index_docs": fb.n_docs, "topics": per}
        finally:
            fb.close()
        atomic_write_json(out / ARMS_FILE, summary)
    return summary


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit expansion-arms", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seeds", help="one keyword seed per topic (expand-queries input)")
    s.add_argument("--topics", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    q = sub.add_parser("queries", help="the round0, round1 and rm3 query files of every topic")
    q.add_argument("--topics", type=Path, required=True)
    q.add_argument("--round1", required=True, help="the expand-queries output (expand.rounds=1) of the seeds")
    q.add_argument("--index", type=Path, required=True, help="the BM25 index the members search (feedback)")
    q.add_argument("--out", type=Path, required=True)
    d = RM3Params()
    q.add_argument("--fb-docs", type=int, default=d.fb_docs)
    q.add_argument("--fb-terms", type=int, default=d.fb_terms)
    q.add_argument("--original-query-weight", type=float, default=d.original_query_weight)
    q.add_argument("--max-df-ratio", type=float, default=d.max_df_ratio)
    q.add_argument("--resolution", type=int, default=100, help="a weight's repetitions per unit in the query text")
    a = p.parse_args(argv)
    topics = load_topics(a.topics)
    if a.cmd == "seeds":
        atomic_write_bytes(a.out, _jsonl(seed_records(topics)))
        print(f"{a.out}: {len(topics)} keyword seeds")
        return 0
    rp = RM3Params(a.fb_docs, a.fb_terms, a.original_query_weight, a.max_df_ratio)
    recs = list(iter_records(resolve_inputs([a.round1])))
    res = write_arms(topics, recs, a.index, a.out, rp, a.resolution)
    n = {m: sum(t["queries"][m] for t in res["topics"].values()) for m in METHODS}
    print(f"{a.out}: {len(topics)} topics; queries " + ", ".join(f"{m} {n[m]}" for m in METHODS))
    return 0
