"""The retrieve step end to end: build, reuse, output format, resume, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _retrieve_data import queries_from, write_corpus, write_queries
from outputs import output_text, read_manifest, records, shard_paths
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import CptkitError
from cptkit.index.store import OpenIndex

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A two-shard real-text corpus (English + Chinese) and 40 queries taken from its documents."""
    root = tmp_path_factory.mktemp("retrieve")
    recs = write_corpus(root / "corpus", n_en=500, n_zh=120, shards=2)
    queries = queries_from(recs, 16, slice(3, 12), slice(10, 24), {"id": "q-none", "text": "zzzqqq xxyyzz"})
    qfile = write_queries(root / "queries.jsonl", queries)
    return root, recs, queries, qfile


def cli(*args: str):
    return runner.invoke(app, ["retrieve", "-q", *args], catch_exceptions=True)


def test_build_then_reuse_identical(data, tmp_path):
    root, recs, queries, qfile = data
    out1, out2 = tmp_path / "r1", tmp_path / "r2"
    r = cli("--queries", str(qfile), "--corpus", str(root / "corpus"), "--out", str(out1), "retrieve.top_k=25")
    assert r.exit_code == 0, r.output
    assert (out1 / "_index" / "index.json").exists() and (out1 / "_SUCCESS").exists()
    r = cli("--queries", str(qfile), "--index", str(out1 / "_index"), "--out", str(out2), "retrieve.top_k=25")
    assert r.exit_code == 0, r.output
    assert not (out2 / "_index").exists()
    assert output_text(out1) == output_text(out2)
    assert (out1 / "_run.tsv").read_bytes() == (out2 / "_run.tsv").read_bytes()

    docs = records(out1)
    by_id = {x["id"]: x for x in recs}
    ids = [d["id"] for d in docs]
    assert len(ids) == len(set(ids))  # each document once
    order = {x["id"]: i for i, x in enumerate(recs)}
    assert [order[i] for i in ids] == sorted(order[i] for i in ids)  # corpus order
    for d in docs:  # all original fields kept, hits sorted by query order
        assert {k: d[k] for k in by_id[d["id"]]} == by_id[d["id"]]
        qpos = [int(h["query_id"][1:]) for h in d["hits"]]
        assert qpos == sorted(qpos)
    lines = [ln.split("\t") for ln in (out1 / "_run.tsv").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == sum(len(d["hits"]) for d in docs)
    per_q: dict[str, list] = {}
    for qid, did, rank, score in lines:
        per_q.setdefault(qid, []).append((int(rank), float(score), did))
    assert "q-none" not in per_q and len(per_q) == len(queries) - 1
    for rows in per_q.values():
        assert [x[0] for x in rows] == list(range(1, len(rows) + 1))
        assert all(a[1] >= b[1] for a, b in zip(rows, rows[1:], strict=False))
        assert len(rows) <= 25
    assert sum(len(rows) == 25 for rows in per_q.values()) >= 0.8 * len(per_q)  # fewer only if fewer match
    # Each query's source document is its top hit (the query is a window of that document).
    src = {f"q{i:03d}": r["id"] for i, r in enumerate(recs[::16])}
    top1 = {qid: rows[0][2] for qid, rows in per_q.items()}
    assert sum(top1[q] == src[q] for q in top1) >= 0.9 * len(top1)
    zh_q = [q for q in top1 if src[q].startswith("zh-")]
    assert zh_q and all(top1[q].startswith("zh-") for q in zh_q)

    manifest = read_manifest(out1)
    ex = manifest["extra"]
    assert ex["queries"] == len(queries) and ex["docs retrieved"] == len(docs) and ex["index docs"] == len(recs)
    assert ex["idf"] == "lucene" and ex["k1"] == 1.2 and ex["b"] == 0.75 and ex["tokenizer"]["cjk"] == "bigram"
    assert manifest["counts"]["records_out"] == len(docs)


def test_output_loads_with_datasets(data, tmp_path):
    import datasets

    root, _, queries, qfile = data
    out = tmp_path / "r"
    r = cli("--queries", str(qfile), "--corpus", str(root / "corpus"), "--out", str(out), "retrieve.top_k=5")
    assert r.exit_code == 0, r.output
    ds = datasets.load_dataset("json", data_files=[str(f) for f in shard_paths(out, ".jsonl.gz")],
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert set(ds.column_names) >= {"id", "text", "source", "lang", "hits"}
    assert sum(len(h) for h in ds["hits"]) == 5 * (len(queries) - 1)
    assert set(ds[0]["hits"][0]) == {"query_id", "rank", "score"}


def test_rerun_is_noop_and_index_dir_option(data, tmp_path):
    root, _, _, qfile = data
    idx, out = tmp_path / "idx", tmp_path / "r"
    args = ["--queries", str(qfile), "--corpus", str(root / "corpus"), "--index", str(idx), "--out", str(out),
            "retrieve.top_k=10"]
    assert cli(*args).exit_code == 0
    assert (idx / "index.json").exists() and not (out / "_index").exists()
    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    istamp = (idx / "index.json").stat().st_mtime_ns
    r = runner.invoke(app, ["retrieve", *args])
    assert r.exit_code == 0
    assert "already complete" in " ".join(r.output.split())
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamp
    assert (idx / "index.json").stat().st_mtime_ns == istamp


def test_rank_bm25_backend_same_ranking(data, tmp_path):
    root, _, _, qfile = data
    common = ["--queries", str(qfile), "retrieve.top_k=10", "retrieve.idf=okapi", "retrieve.dtype=float64"]
    a, b = tmp_path / "fast", tmp_path / "ref"
    assert cli(*common, "--corpus", str(root / "corpus"), "--out", str(a)).exit_code == 0
    r = cli(*common, "--index", str(a / "_index"), "--out", str(b), "retrieve.backend=rank_bm25")
    assert r.exit_code == 0, r.output
    ra = [ln.split("\t") for ln in (a / "_run.tsv").read_text().splitlines()]
    rb = [ln.split("\t") for ln in (b / "_run.tsv").read_text().splitlines()]
    assert [x[:3] for x in ra] == [x[:3] for x in rb] and len(ra) > 100
    assert max(abs(float(x[3]) - float(y[3])) for x, y in zip(ra, rb, strict=True)) <= 1e-6


def test_index_reused_with_other_params_and_mismatch_errors(data, tmp_path):
    root, _, _, qfile = data
    a = tmp_path / "a"
    assert cli("--queries", str(qfile), "--corpus", str(root / "corpus"), "--out", str(a)).exit_code == 0
    idx = OpenIndex(a / "_index")
    assert idx.n_docs == idx.meta["docs"] and idx.docs.record(0)["id"] == "en-00000"
    idx.close()
    # Other k1/b/IDF: rescored from the stored tf, no rebuild.
    r = cli("--queries", str(qfile), "--index", str(a / "_index"), "--out", str(tmp_path / "b"), "retrieve.k1=0.9")
    assert r.exit_code == 0
    assert (a / "_run.tsv").read_text() != (tmp_path / "b" / "_run.tsv").read_text()
    # Another tokenizer cannot use this index.
    r = cli("--queries", str(qfile), "--index", str(a / "_index"), "--out", str(tmp_path / "c"),
            "retrieve.tokenizer.cjk_unigrams=true")
    assert isinstance(r.exception, CptkitError) and "tokenizer" in str(r.exception)
    assert not (tmp_path / "c").exists()
    # No index and no corpus.
    r = cli("--queries", str(qfile), "--index", str(tmp_path / "nothing"), "--out", str(tmp_path / "d"))
    assert isinstance(r.exception, CptkitError) and "no finished index" in str(r.exception)


def test_bad_query_file_one_line_exit_2(data, tmp_path):
    root, _, _, _ = data
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q1", "text": "python module"}\n{"id": "q2", "text": \n')
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-c", "from cptkit.cli import main; main()", "retrieve", "-q", "--queries",
                        str(bad), "--corpus", str(root / "corpus"), "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and f"{bad}:2: malformed JSON" in err[0], p.stderr
    assert not out.exists()  # nothing half-written, no index built
