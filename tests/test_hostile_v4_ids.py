"""Hostile input v4 (§6), through the real CLI: an id is written as a column of retrieve's ``_run.tsv``
(tab-separated, or TREC's space-separated columns), so an id holding a tab and a newline forged a hit
row, and a space shifted the TREC columns. Such ids are refused where they are read: one line naming
the file and line, exit 2, no run file."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_jsonl
from test_hostile_input import one_line, run_cli

from cptkit.core.errors import BadInput
from cptkit.core.records import plain_id_problem
from cptkit.core.shards import read_records
from cptkit.index.base import BM25Params
from cptkit.index.store import build_index
from cptkit.text.tokenize import Tokenizer, TokenizerConfig

FORGED = "q0\tdoc-forged\t1\t99.000000\nq1"  # one query id that writes a whole extra hit row


def _corpus(tmp_path: Path, ids: list[str] | None = None) -> Path:
    ids = ids or [f"d{i}" for i in range(6)]
    return write_jsonl(tmp_path / "corpus" / "part-0.jsonl",
                       [{"id": d, "text": f"cells and proteins, document {k}"} for k, d in enumerate(ids)])


def _queries(tmp_path: Path, ids: list[str]) -> Path:
    return write_jsonl(tmp_path / "q.jsonl", [{"id": q, "text": "cells proteins"} for q in ids])


def _no_run(out: Path) -> None:
    assert not (out / "_run.tsv").exists() and not (out / "_SUCCESS").exists()


@pytest.mark.parametrize("rid, shown", [(FORGED, "'\\t'"), ("q\x001", "'\\x00'"), ("q\u20281", "'\\u2028'")])
def test_reader_refuses_ids_that_are_not_plain(tmp_path, rid, shown):
    path = _queries(tmp_path, ["q0", rid])
    with pytest.raises(BadInput) as e:
        list(read_records(str(path), plain_ids=True))
    assert str(e.value).startswith(f"{path}:2: id ") and shown in str(e.value)
    assert [r["id"] for r in read_records(str(path))] == ["q0", rid]  # steps writing no tabular file: as before
    assert [r["id"] for r in read_records(str(path), plain_ids=True, skip_bad=True)] == ["q0"]
    # a space (or a no-break space) is one character of a tab-separated column
    ok = _queries(tmp_path / "ok", ["q 0", "q\xa01"])
    assert [r["id"] for r in read_records(str(ok), plain_ids=True)] == ["q 0", "q\xa01"]


def test_a_space_is_a_plain_tsv_id(tmp_path):
    # the demo corpus' own ids hold spaces ("gcide/A 1"): one tab-separated column each, never refused there
    out = tmp_path / "out"
    corpus = _corpus(tmp_path, ["d0", "gcide/A 1", "d2"])
    r = run_cli(["retrieve", "--queries", _queries(tmp_path, ["q 0"]), "--corpus", corpus, "--out", out, "-q"])
    assert r.returncode == 0, r.stderr
    rows = [ln.split("\t") for ln in (out / "_run.tsv").read_text(encoding="utf-8").splitlines()]
    assert rows and all(len(x) == 4 and x[0] == "q 0" for x in rows) and "gcide/A 1" in {x[1] for x in rows}


def test_forged_query_id_refused(tmp_path):
    out = tmp_path / "out"
    q = _queries(tmp_path, ["q0", FORGED])
    r = run_cli(["retrieve", "--queries", q, "--corpus", _corpus(tmp_path), "--out", out, "-q"])
    one_line(r, f"{q}:2: id 'q0\\tdoc-forged", "holds '\\t'", "no tab, line break or control character")
    _no_run(out)


def test_corpus_id_with_a_space_is_escaped_in_trec_columns(tmp_path):
    # TREC's columns are space-separated: an id's whitespace (and %) is percent-encoded, six columns a row
    out = tmp_path / "out"
    corpus = _corpus(tmp_path, ["d0", "d1", "doc 2 Q0", "d%3"])
    r = run_cli(["retrieve", "--queries", _queries(tmp_path, ["q 0"]), "--corpus", corpus, "--out", out, "-q",
                 "retrieve.run_format=trec"])
    assert r.returncode == 0, r.stderr
    rows = [ln.split(" ") for ln in (out / "_run.tsv").read_text(encoding="utf-8").splitlines()]
    assert rows and all(len(x) == 6 and x[0] == "q%200" and x[1] == "Q0" for x in rows)
    assert {"doc%202%20Q0", "d%253"} <= {x[2] for x in rows}


def test_index_built_before_the_check_is_refused_when_written(tmp_path):
    """An index whose stored documents hold such an id (an older cptkit, or build_index called
    directly) cannot reach the run file either: the error names the index."""
    index = tmp_path / "index"
    docs = [{"id": "d0", "text": "cells"}, {"id": "d1\tforged\t1\t9.0\nq0", "text": "cells proteins"}]
    tok = Tokenizer(TokenizerConfig())
    build_index(iter(docs), index, tok, BM25Params())
    out = tmp_path / "out"
    r = run_cli(["retrieve", "--queries", _queries(tmp_path, ["q0"]), "--index", index, "--out", out, "-q"])
    one_line(r, str(index), "document 1: id 'd1\\tforged", "rebuild the index")
    _no_run(out)


def test_plain_ids_still_run_and_stay_one_row_per_hit(tmp_path):
    ids = ["python-docs/tutorial#intro", "zh-文档-00001", "manpages-zh/ls~p1", "a,b;c'd\"e"]
    out = tmp_path / "out"
    r = run_cli(["retrieve", "--queries", _queries(tmp_path, ["q/0", "q#1"]), "--corpus", _corpus(tmp_path, ids),
                 "--out", out, "-q", "retrieve.run_format=trec"])
    assert r.returncode == 0, r.stderr
    rows = [ln.split(" ") for ln in (out / "_run.tsv").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 8 and all(len(x) == 6 and x[1] == "Q0" for x in rows)
    assert {x[2] for x in rows} == set(ids) and all(plain_id_problem(i) is None for i in ids)
