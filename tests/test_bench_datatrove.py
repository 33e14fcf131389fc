"""bench/datatrove.py at toy size: both sides of every row run for real (cptkit's commands and the
datatrove scripts, each in its own process, on ~300 demo-corpus documents with planted copies) and
their outputs agree as docs/benchmarks.md says. No timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import write_jsonl
from mixdata import make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import datatrove as bdt  # noqa: E402

pytest.importorskip("datatrove", reason="pip install datatrove[processing]==0.10.1 (the dev extra)")
pytestmark = pytest.mark.slow(minutes=2)


@pytest.fixture(scope="module")
def toy(corpus_records: list[dict], tmp_path_factory) -> dict:
    """Every row run once on the same 300 documents: {"docs", "planted", "p", "results"}."""
    root = tmp_path_factory.mktemp("dtb")
    mixed = root / "corpus"  # every third record: English docs and dictionary entries, Chinese pages
    write_jsonl(mixed / "part-00000.jsonl.gz", corpus_records[::3])
    docs, planted = bdt.corpus_docs(300, mixed)
    tok = make_tokenizer(corpus_records, root / "bpe")
    p = bdt.prepare(docs, root / "run", str(tok))
    return {"docs": docs, "planted": planted, "p": p, "results": {row: bdt.run_row(row, p) for row in bdt.ROWS}}


def test_dedup_both_sides_find_the_planted_pairs(toy):
    c = bdt.check("dedup", toy["results"]["dedup"], toy["docs"], toy["planted"])
    assert c["planted_true"] >= 3, c  # the toy corpus holds pairs to find
    assert c["cptkit"]["recall"] == 1.0 and c["cptkit"]["precision"] == 1.0, c
    assert c["datatrove"]["recall"] == 1.0 and c["datatrove"]["removed"] >= c["planted_true"], c
    assert c["both_removed"] >= c["planted_true"], c


def test_quality_filter_keeps_the_same_ids(toy):
    c = bdt.check("quality", toy["results"]["quality"], toy["docs"], toy["planted"])
    assert c["identical"] and 0 < c["cptkit_kept"] < len(toy["docs"]), c


def test_language_filter_agrees(toy):
    c = bdt.check("lang", toy["results"]["lang"], toy["docs"], toy["planted"])
    assert 0 < c["cptkit_kept"] < len(toy["docs"]), c  # English kept, Chinese dropped
    assert c["agreement"] >= 0.99, c


def test_token_streams_are_identical(toy):
    c = bdt.check("tokenize", toy["results"]["tokenize"], toy["docs"], toy["planted"])
    assert c["identical"] and c["cptkit_docs"] == c["datatrove_docs"] == len(toy["docs"]), c


def test_chain_ends_in_comparable_streams(toy):
    c = bdt.check_tokens(toy["results"]["chain"])
    assert 0 < c["cptkit_docs"] < len(toy["docs"]) and 0 < c["datatrove_docs"] < len(toy["docs"]), c
    assert abs(c["cptkit_docs"] - c["datatrove_docs"]) <= 0.05 * c["cptkit_docs"], c


def test_user_code_is_counted_without_blanks_or_comments():
    assert bdt.code_lines("import x\n\n# a comment\n  y = 1  # trailing\n") == 2
    assert [len(bdt.cptkit_cmds(row, {k: k for k in ("input", "output", "work", "model", "min_quality", "lid",
                                                     "min_lang", "lang_chars", "tokenizer_dir")}))
            for row in bdt.ROWS] == [1, 1, 1, 1, 3]
