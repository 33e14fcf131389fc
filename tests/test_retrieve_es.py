"""The Elasticsearch/OpenSearch backend: request bodies (no server needed), the unreachable-server
error, and an integration test against a real server when ``CPTKIT_ES_URL`` is set.

No Elasticsearch or OpenSearch server can be installed offline on this project's machines, so the
integration test is skipped here; run it with e.g. ``CPTKIT_ES_URL=http://localhost:9200``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _retrieve_data import write_corpus
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import CptkitError
from cptkit.index.base import BM25Params
from cptkit.index.elasticsearch import (
    SIMILARITY,
    EsClient,
    EsConfig,
    bulk_body,
    index_body,
    msearch_body,
    parse_msearch,
    search_body,
)

ES_URL = os.environ.get("CPTKIT_ES_URL")


def ndjson(b: bytes) -> list[dict]:
    assert b.endswith(b"\n")
    return [json.loads(line) for line in b.decode("utf-8").splitlines()]


def test_index_body_sets_bm25_similarity_from_config():
    body = index_body(BM25Params(k1=0.9, b=0.4), {"docs": 3}, shards=2, replicas=1)
    idx = body["settings"]["index"]
    assert idx["similarity"] == {SIMILARITY: {"type": "BM25", "k1": 0.9, "b": 0.4}}
    assert idx["number_of_shards"] == 2 and idx["number_of_replicas"] == 1
    props = body["mappings"]["properties"]
    assert props["tokens"]["similarity"] == SIMILARITY and props["tokens"]["analyzer"] == "whitespace"
    assert props["rec"] == {"type": "object", "enabled": False} and props["pos"]["type"] == "long"
    assert body["mappings"]["_meta"] == {"cptkit": {"docs": 3}}
    with pytest.raises(CptkitError, match="retrieve.idf=lucene"):
        index_body(BM25Params(idf="okapi"), {})


def test_bulk_body_is_ndjson_with_position_ids():
    docs = [(0, {"id": "a", "text": "Hello wörld"}, ["hello", "wörld"]), (7, {"id": "b", "text": "机器学习"},
                                                                            ["机器", "器学", "学习"])]
    lines = ndjson(bulk_body("ix", docs))
    assert lines == [
        {"index": {"_index": "ix", "_id": "0"}}, {"pos": 0, "tokens": "hello wörld", "rec": docs[0][1]},
        {"index": {"_index": "ix", "_id": "7"}}, {"pos": 7, "tokens": "机器 器学 学习", "rec": docs[1][1]},
    ]
    assert "机器" in bulk_body("ix", docs).decode("utf-8")  # UTF-8, not \\u escapes
    assert bulk_body("ix", []) == b""


def test_search_body_counts_repeated_terms_and_breaks_ties_by_position():
    body = search_body(["the", "cat", "the", "the", "sat"], 1000)
    assert body["size"] == 1000
    assert body["query"] == {"bool": {"should": [
        {"term": {"tokens": {"value": "the", "boost": 3}}}, {"term": {"tokens": "cat"}}, {"term": {"tokens": "sat"}}]}}
    assert body["sort"] == [{"_score": {"order": "desc"}}, {"pos": {"order": "asc"}}] and body["track_scores"]
    assert search_body([], 5)["query"] == {"match_none": {}}
    lines = ndjson(msearch_body("ix", [["a"], ["b", "b"]], 10))
    assert lines[0] == {"index": "ix"} and lines[2] == {"index": "ix"} and len(lines) == 4
    assert lines[3]["query"]["bool"]["should"] == [{"term": {"tokens": {"value": "b", "boost": 2}}}]


def test_parse_msearch_rescales_and_raises_on_errors():
    resp = {"responses": [{"hits": {"hits": [{"_score": 2.0, "_source": {"pos": 4, "rec": {"id": "x"}}}]}},
                          {"hits": {"hits": []}}]}
    assert parse_msearch(resp, 1.5) == [[(4, 5.0, {"id": "x"})], []]  # × (k1 + 1): cptkit's scale
    bad = {"responses": [{"error": {"root_cause": [{"type": "too_many_clauses", "reason": "maxClauseCount"}]}}]}
    with pytest.raises(CptkitError, match="too_many_clauses: maxClauseCount"):
        parse_msearch(bad, 1.5)


def test_unreachable_server_is_one_clear_error(tmp_path):
    client = EsClient(EsConfig(url="http://127.0.0.1:9", retries=1, backoff_s=0.01, timeout_s=2))
    with pytest.raises(CptkitError, match=r"elasticsearch at http://127.0.0.1:9 is unreachable .*2 attempts"):
        client.request("GET", "/")
    with pytest.raises(CptkitError, match="must be http"):
        EsClient(EsConfig(url="localhost:9200"))
    assert EsClient(EsConfig(url="http://u:p%40ss@h:9200")).headers["Authorization"] == "Basic dTpwQHNz"
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "q1", "text": "python"}\n')
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "d1", "text": "python docs"}\n')
    p = subprocess.run([sys.executable, "-c", "from cptkit.cli import main; main()", "retrieve", "-q", "--queries",
                        str(q), "--corpus", str(corpus), "--out", str(tmp_path / "r"), "retrieve.backend=elasticsearch",
                        "retrieve.es.url=http://127.0.0.1:9", "retrieve.es.retries=0"], capture_output=True, text=True)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(err) == 1 and "unreachable" in err[0], p.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(not ES_URL, reason="no Elasticsearch/OpenSearch server: set CPTKIT_ES_URL=http://host:9200 "
                    "(none can be installed offline here)")
def test_elasticsearch_matches_bm25_backend(tmp_path):
    recs = write_corpus(tmp_path / "corpus", n_en=300, n_zh=60, shards=2)
    queries = [{"id": f"q{i:03d}", "text": " ".join(r["text"].split()[2:12])} for i, r in enumerate(recs[::12])]
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries), encoding="utf-8")
    name = f"cptkit-test-{os.getpid()}"
    runner = CliRunner()
    common = ["retrieve", "-q", "--queries", str(qfile), "--corpus", str(tmp_path / "corpus"), "retrieve.top_k=10"]
    es = ["retrieve.backend=elasticsearch", f"retrieve.es.url={ES_URL}", f"retrieve.es.index={name}",
          "retrieve.es.recreate=true", "retrieve.es.bulk_docs=100", "retrieve.es.msearch_batch=8"]
    try:
        r = runner.invoke(app, [*common, "--out", str(tmp_path / "es"), *es])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, [*common, "--out", str(tmp_path / "local")])
        assert r.exit_code == 0, r.output
        # Reuse: the finished index is found by its _meta and not rebuilt.
        r = runner.invoke(app, [*common, "--out", str(tmp_path / "es2"), *es[:-3]])
        assert r.exit_code == 0, r.output
        assert json.loads((tmp_path / "es2" / "_manifest.json").read_text())["extra"]["index reused"]

        def per_query(d):
            out: dict[str, list] = {}
            for ln in (d / "_run.tsv").read_text(encoding="utf-8").splitlines():
                qid, did, _, score = ln.split("\t")
                out.setdefault(qid, []).append((did, float(score)))
            return out

        a, b = per_query(tmp_path / "es"), per_query(tmp_path / "local")
        assert a.keys() == b.keys() and len(a) == len(queries)
        overlap = [len({d for d, _ in a[q]} & {d for d, _ in b[q]}) / len(b[q]) for q in b]
        assert sum(overlap) / len(overlap) >= 0.9
        assert sum(a[q][0][0] == b[q][0][0] for q in b) >= 0.9 * len(b)
        # Same formula up to Lucene's one-byte document-length encoding: top scores within 5%.
        assert all(abs(a[q][0][1] - b[q][0][1]) <= 0.05 * b[q][0][1] for q in b if a[q][0][0] == b[q][0][0])
        assert (tmp_path / "es2" / "_run.tsv").read_text() == (tmp_path / "es" / "_run.tsv").read_text()
    finally:
        EsClient(EsConfig(url=ES_URL)).request("DELETE", name, ok404=True)
