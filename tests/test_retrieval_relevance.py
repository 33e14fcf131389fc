"""Relevance of a retrieved set: precision/recall worked by hand on a tiny hand-made corpus, the
round-robin budget, the bootstrap interval, the CLI on a real retrieve output, and the labels file."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.eval.retrieval_relevance import (
    RELEVANCE,
    Labels,
    main,
    relevance,
    round_robin,
)
from cptkit.eval.stats import bootstrap_ci

ROOT = Path(__file__).resolve().parent.parent

# Ten documents: four relevant by the rules below (the two maxima pages, python's math page, one
# of its two sections), six not (another python page, the dictionary, a Chinese fortune).
CORPUS = [
    {"id": "m1", "text": "integrate computes the integral of an expression", "meta": {"package": "maxima-doc"}},
    {"id": "m2", "text": "diff computes the derivative of an expression", "meta": {"package": "maxima-doc"}},
    {"id": "p1", "text": "math.sqrt returns the square root", "url": "https://docs.python.org/3.11/library/math.html",
     "meta": {"package": "python3.11-doc"}},
    {"id": "p2", "text": "math.gcd returns the greatest common divisor",
     "url": "https://docs.python.org/3.11/library/math.html#number-theoretic", "meta": {"package": "python3.11-doc"}},
    {"id": "p3", "text": "socket opens a network connection", "url": "https://docs.python.org/3.11/library/socket.html",
     "meta": {"package": "python3.11-doc"}},
    {"id": "g1", "text": "integral: a whole; the result of integration (Math.)", "meta": {"package": "dict-gcide"}},
    {"id": "g2", "text": "derivative: a thing derived (Math.)", "meta": {"package": "dict-gcide"}},
    {"id": "g3", "text": "root: the part of a plant below ground (Bot.)", "meta": {"package": "dict-gcide"}},
    {"id": "g4", "text": "socket: a hollow into which something fits", "meta": {"package": "dict-gcide"}},
    {"id": "f1", "text": "要有礼貌", "meta": {"package": "fortunes-zh"}},
]
RULES = {"name": "math", "relevant": [{"meta.package": "maxima-doc"},
                                      {"meta.package": ["python3.11-doc"],
                                       "url": ["https://docs.python.org/3.11/library/math.html*"]}]}


def test_labels_match_every_field_of_a_rule():
    labels = Labels.from_dict(RULES)
    assert [r["id"] for r in CORPUS if labels(r)] == ["m1", "m2", "p1", "p2"]
    # a rule needs all its fields: python3.11-doc without the url does not match, nor the url alone
    assert not labels({"meta": {"package": "python3.11-doc"}})
    assert not labels({"url": "https://docs.python.org/3.11/library/math.html", "meta": {"package": "x"}})
    with pytest.raises(CptkitError, match="non-empty list of rules"):
        Labels.from_dict({"name": "x", "relevant": []})
    with pytest.raises(CptkitError, match=r"relevant\[0\].url must be a glob"):
        Labels.from_dict({"relevant": [{"url": [1]}]})


def test_precision_and_recall_by_hand():
    # retrieved m1, g1, p3, p1, g2: relevant m1 and p1 -> precision 2/5, recall 2/4 (4 relevant in 10)
    labels = Labels.from_dict(RULES)
    by_id = {r["id"]: r for r in CORPUS}
    got = relevance([labels(by_id[i]) for i in ["m1", "g1", "p3", "p1", "g2"]], relevant_in_corpus=4, corpus_docs=10)
    assert (got["retrieved"], got["relevant_retrieved"], got["relevant_in_corpus"], got["corpus_docs"]) == (5, 2, 4, 10)
    assert got["precision"] == 0.4 and got["recall"] == 0.5 and got["base_rate"] == 0.4
    lo, hi = got["precision_ci"]
    assert 0.0 <= lo < 0.4 < hi <= 1.0
    assert got["recall_ci"] == pytest.approx([lo * 5 / 4, hi * 5 / 4])  # recall = precision * 5 / 4
    # nothing retrieved: no precision, recall 0; everything relevant retrieved: recall 1, interval [1, 1]
    empty = relevance([], 4, 10)
    assert math.isnan(empty["precision"]) and empty["recall"] == 0.0
    full = relevance([True] * 4, 4, 10)
    assert full["recall"] == 1.0 and full["precision_ci"] == [1.0, 1.0] and full["recall_ci"] == [1.0, 1.0]
    with pytest.raises(CptkitError, match="not from this corpus"):
        relevance([True] * 5, 4, 10)


def test_precision_interval_is_the_percentile_bootstrap_of_the_mean():
    # 30 of 100 relevant: the interval is stats.bootstrap_ci on the 0/1 values, near the normal one
    r = relevance([True] * 30 + [False] * 70, 60, 1000, seed=1)
    lo, hi = r["precision_ci"]
    assert (lo, hi) == bootstrap_ci([1.0] * 30 + [0.0] * 70, seed=1)
    assert lo < 0.3 < hi and hi - lo == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 100), abs=0.03)
    assert r["recall_ci"] == [lo * 100 / 60, hi * 100 / 60]
    assert relevance([False] * 50, 5, 100)["precision_ci"] == [0.0, 0.0]
    assert all(math.isnan(v) for v in relevance([], 5, 100)["precision_ci"])


def test_round_robin_budget():
    hits = [("q1", "a", 1), ("q1", "b", 2), ("q1", "c", 3), ("q2", "b", 1), ("q2", "d", 2), ("q3", "e", 1)]
    # rank 1: a (q1), b (q2), e (q3); rank 2: b again (already in), d; rank 3: c
    assert round_robin(hits, 4) == ["a", "b", "e", "d"]
    assert round_robin(hits, 2) == ["a", "b"]
    assert round_robin(reversed(hits), 3) == ["e", "b", "a"]  # query order = order of first appearance
    assert round_robin(hits, 100) == ["a", "b", "e", "d", "c"]  # fewer documents than the budget


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def test_cli_on_a_real_retrieve_output(tmp_path, monkeypatch):
    """expand-queries' output dir is the retrieve's --queries: the file records its config (rounds)."""
    from cptkit.steps.expand_queries import run as expand
    from cptkit.steps.retrieve import run as retrieve

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "corpus" / "part-00000.jsonl.gz", CORPUS)
    (tmp_path / "seeds.jsonl").write_text(json.dumps({"id": "k", "text": "integral derivative"}) + "\n"
                                          + json.dumps({"id": "s", "text": "socket root"}) + "\n")
    # rounds=0: the seeds are the queries (no LLM is loaded: the model does not exist)
    expand(compose_step("expand-queries", ["io.inputs=[seeds.jsonl]", "io.output=q", "quiet=true", "expand.rounds=0",
                                           "llm.model=/nonexistent", "llm.seed=7"]))
    retrieve(compose_step("retrieve", ["io.inputs=[corpus]", "io.output=r", "quiet=true", "retrieve.queries=[q]",
                                       "retrieve.top_k=3", "retrieve.index=idx"]))
    (tmp_path / "labels.yaml").write_text(json.dumps(RULES))
    assert main(["--retrieved", "r", "--corpus", "corpus", "--labels", "labels.yaml", "--budget", "2"]) == 0
    res = json.loads((tmp_path / "r" / RELEVANCE).read_text())
    run = [line.split("\t") for line in (tmp_path / "r" / "_run.tsv").read_text().splitlines()]
    retrieved = {d for _, d, _, _ in run}
    rel = {"m1", "m2", "p1", "p2"}
    # BM25 top-3: "integral derivative" hits g1, g2 (both words' documents) and m1/m2 (one each)
    assert res["all"]["retrieved"] == len(retrieved) and res["all"]["relevant_retrieved"] == len(retrieved & rel)
    assert res["all"]["recall"] == len(retrieved & rel) / 4 and res["all"]["corpus_docs"] == 10
    first = {run[0][1], next(d for q, d, r, _ in run if q == "s" and r == "1")}  # the rank-1 hit of each query
    assert res["budget"]["retrieved"] == 2 and res["budget"]["filled"] is True
    assert res["budget"]["relevant_retrieved"] == len(first & rel)
    assert res["queries"]["config"]["expand"]["rounds"] == 0 and res["queries"]["config"]["llm"]["seed"] == 7
    assert res["top_k"] == 3 and res["labels"]["name"] == "math"
    assert res["labels"]["relevant_by_package"] == {"maxima-doc": 2, "python3.11-doc": 2}
    assert main(["--retrieved", "q", "--corpus", "corpus", "--labels", "labels.yaml"]) == 2  # not a retrieve output


def test_the_claims_labels_file():
    """conf/reproduce/relevance_stem.yaml: maxima-doc, python's Numeric and Mathematical Modules only."""
    labels = Labels.load(ROOT / "conf" / "reproduce" / "relevance_stem.yaml")
    py = "https://docs.python.org/3.11/library/"
    assert labels({"meta": {"package": "maxima-doc", "section": "Introduction to Maxima"}})
    for page in ("math.html", "cmath.html#power", "decimal.html", "fractions.html", "statistics.html",
                 "random.html", "numbers.html", "numeric.html"):
        assert labels({"url": py + page, "meta": {"package": "python3.11-doc"}}), page
    for page in ("socket.html", "mathematical.html", "../tutorial/floatingpoint.html"):
        assert not labels({"url": py + page, "meta": {"package": "python3.11-doc"}}), page
    for pkg in ("dict-gcide", "manpages-zh", "debian-reference-zh-cn", "fortunes-zh"):
        assert not labels({"url": py + "math.html", "meta": {"package": pkg}}), pkg
