"""Sharded retrieval: index shards built as separate array jobs, global statistics, fan-out + merge.

The result must equal the single index over the same corpus: same ranks, same scores.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _retrieve_data import queries_from, write_corpus, write_queries
from outputs import output_text, read_manifest
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import CptkitError
from cptkit.index.base import BM25Params
from cptkit.index.bm25 import BM25Index
from cptkit.index.sharded import OpenShardedIndex, ShardedSearcher, globalize, merge_stats
from cptkit.text.tokenize import Tokenizer

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A 5-file real-text corpus (English + Chinese), 30 queries from its documents, one index shards dir."""
    root = tmp_path_factory.mktemp("sharded")
    recs = write_corpus(root / "corpus", n_en=400, n_zh=100, shards=5)
    queries = queries_from(recs, 17, slice(2, 14), slice(5, 20),
                           {"id": "q-rep", "text": "the the module module module file"})  # repeated terms
    qfile = write_queries(root / "queries.jsonl", queries)
    sidx = root / "sidx"
    for i in range(3):  # three "array jobs": shard.index=i shard.count=3 (files 0,3 | 1,4 | 2)
        r = runner.invoke(app, ["retrieve-index", "-q", "--corpus", str(root / "corpus"), "--out", str(sidx),
                                f"shard.index={i}", "shard.count=3"])
        assert r.exit_code == 0, r.output
        assert (sidx / "_SUCCESS").exists() == (i == 2)  # complete only when the last shard is built
    return root, recs, queries, qfile, sidx


def run_file(d):
    return [ln.split("\t") for ln in (d / "_run.tsv").read_text(encoding="utf-8").splitlines()]


def test_sharded_run_equals_single_index(data, tmp_path):
    root, recs, queries, qfile, sidx = data
    metas = [json.loads((sidx / f"shard-{i:05d}-of-00003" / "index.json").read_text()) for i in range(3)]
    assert [[s["file_index"] for s in m["sources"]] for m in metas] == [[0, 3], [1, 4], [2]]
    assert sum(m["docs"] for m in metas) == len(recs)
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    r = runner.invoke(app, ["retrieve", "-q", "--queries", str(qfile), "--corpus", str(root / "corpus"),
                            "--out", str(single), "retrieve.top_k=40"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["retrieve", "-q", "--queries", str(qfile), "--corpus", str(root / "corpus"),
                            "--index", str(sidx), "--out", str(sharded), "retrieve.top_k=40", "retrieve.threads=2"])
    assert r.exit_code == 0, r.output
    a, b = run_file(single), run_file(sharded)
    assert len(a) == len(b) > 40 * (len(queries) - 5)
    assert [x[:3] for x in a] == [x[:3] for x in b]  # same documents at the same ranks
    assert max(abs(float(x[3]) - float(y[3])) for x, y in zip(a, b, strict=True)) <= 1e-6
    assert a == b  # in fact byte-identical: per-posting scores are bit-identical
    assert output_text(single) == output_text(sharded)
    ex = read_manifest(sharded)["extra"]
    assert ex["index shards"] == 3 and ex["index docs"] == len(recs)
    ex1 = read_manifest(single)["extra"]
    assert ex["index terms"] == ex1["index terms"] and ex["index postings"] == ex1["index postings"]
    assert ex["index avgdl"] == ex1["index avgdl"]


def test_global_statistics_and_scores_equal_single_index(data):
    root, recs, queries, _, sidx = data
    idx = OpenShardedIndex(sidx)
    tok = Tokenizer()
    toks = [tok(r["text"]) for r in recs]
    for params, dtype in ((BM25Params(), "float32"), (BM25Params(k1=0.9, b=0.4, idf="okapi"), "float64")):
        single = BM25Index.build(toks, params, dtype=dtype)
        parts = [p.bm25 if dtype == "float32" else
                 BM25Index(p.bm25.vocab, p.bm25.indptr, p.bm25.post_doc, p.bm25.post_tf, None, p.bm25.doc_len,
                           params, dtype) for p in idx.parts]
        df, n, total = merge_stats(parts)
        assert n == single.n_docs == len(recs) and total == int(single.doc_len.sum())
        assert df == {t: int(single.df[i]) for t, i in single.vocab.items()}
        g = globalize(parts, params)
        # Local shard statistics differ from the global ones; globalized scores equal the single index's.
        assert g[0].avgdl == single.avgdl != parts[0].avgdl
        searcher = ShardedSearcher(g, idx.global_ids, params)
        qs = [tok(q["text"]) for q in queries]
        for q in qs[:8]:
            np.testing.assert_allclose(searcher.get_scores(q), single.get_scores(q), rtol=1e-12 if dtype == "float64"
                                       else 0, atol=1e-12)
        x, y = searcher.search(qs, 25), single.search(qs, 25)
        np.testing.assert_array_equal(x.counts, y.counts)
        np.testing.assert_array_equal(x.docs, y.docs)
        np.testing.assert_allclose(x.scores, y.scores, rtol=1e-12, atol=0)
    idx.close()


def test_missing_shard_and_mismatch_errors(data, tmp_path):
    root, _, _, qfile, _ = data
    part = tmp_path / "part"
    r = runner.invoke(app, ["retrieve-index", "-q", "--corpus", str(root / "corpus"), "--out", str(part),
                            "shard.index=1", "shard.count=4"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["retrieve", "-q", "--queries", str(qfile), "--index", str(part), "--out", str(tmp_path / "x")])
    assert isinstance(r.exception, CptkitError)
    assert "3 of 4 shards not built yet (first missing: shard 0)" in str(r.exception)
    r = runner.invoke(app, ["retrieve-index", "-q", "--corpus", str(root / "corpus"), "--out", str(tmp_path / "y"),
                            "retrieve.shards=6"])
    assert isinstance(r.exception, CptkitError) and "5 corpus file(s) cannot make 6 index shards" in str(r.exception)


def test_all_shards_in_one_process(data, tmp_path):
    root, recs, _, _, sidx = data
    one = tmp_path / "one"
    r = runner.invoke(app, ["retrieve-index", "-q", "--corpus", str(root / "corpus"), "--out", str(one),
                            "retrieve.shards=3"])
    assert r.exit_code == 0, r.output
    for i in range(3):
        name = f"shard-{i:05d}-of-00003"
        for f in ("post_doc.npy", "post_score.npy", "docs.jsonl", "vocab.json"):
            assert (one / name / f).read_bytes() == (sidx / name / f).read_bytes()
