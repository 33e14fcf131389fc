"""corrupt: pure transformations, realised ratio on real text, determinism across processes."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys

import pytest
from classify_realtext import python_docs
from conftest import read_jsonl_dir as read_out
from conftest import write_jsonl
from outputs import shard_paths, shard_text

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.steps import corrupt
from cptkit.synthetic.corruption import (
    Lexicon,
    Token,
    choose_count,
    corrupt_text,
    pluralize,
    random_number_like,
)
from cptkit.text import wordnet
from cptkit.text.hashing import rng_for


def test_numbers_keep_their_form():
    rng = random.Random(0)
    for s in ["7", "17", "2024", "3.14159", "1,250,000", "0.5", "007", "10"]:
        for _ in range(200):
            new = random_number_like(s, rng)
            assert new != s
            assert re.sub(r"\d", "9", new) == re.sub(r"\d", "9", s)  # same digits count and separators
            for old_run, new_run in zip(re.findall(r"\d+", s), re.findall(r"\d+", new), strict=True):
                if len(old_run) > 1 and old_run[0] != "0":
                    assert new_run[0] != "0"


def test_choose_count_is_unbiased_and_zero_at_zero():
    rng = random.Random(1)
    assert all(choose_count(n, 0.0, rng) == 0 for n in range(50))
    ks = [choose_count(7, 0.3, rng) for _ in range(20000)]
    assert set(ks) == {2, 3}
    assert sum(ks) / len(ks) == pytest.approx(2.1, abs=0.02)
    assert choose_count(5, 1.0, rng) == 5


LEX = Lexicon(nouns=lambda w: {"chlorine": ["neon", "oxygen"], "tank": ["box"]}.get(w, []),
              antonyms=lambda w: {"equal": ["unequal"]}.get(w, []))


def toks(text: str, tagged: dict[str, tuple[str, str]]) -> list[Token]:
    return [Token(m.start(), m.end(), *tagged[m.group()]) for m in re.finditer(r"\w+", text) if m.group() in tagged]


def test_corrupt_text_with_a_small_lexicon():
    text = "Chlorine and chlorine: 2 tanks of equal size hold 17 L. Tanks."
    tags = {"Chlorine": ("NN", "chlorine"), "chlorine": ("NN", "chlorine"), "tanks": ("NNS", "tank"),
            "Tanks": ("NNS", "tank"), "equal": ("JJ", "equal"), "size": ("NN", "size")}
    tokens = toks(text, tags)
    same, rep = corrupt_text(text, 0.0, random.Random(0), tokens, LEX)
    assert same == text and rep["changed"] == 0
    # candidates: numbers 2 and 17, nouns chlorine and tank (twice each; size once, no lexicon entry);
    # "equal" occurs once: not frequent at the default adj_min_count=2
    assert rep["candidates"] == 4 and rep["candidates_by_type"] == {"number": 2, "noun": 2, "adj": 0}
    new, rep = corrupt_text(text, 1.0, random.Random(0), tokens, LEX, adj_min_count=1)
    assert rep["candidates_by_type"] == {"number": 2, "noun": 2, "adj": 1} and rep["changed"] == 5
    assert re.fullmatch(r"(Neon|Oxygen) and (neon|oxygen): \d boxes of unequal size hold \d\d L\. Boxes\.", new), new
    assert new.count("Neon") + new.count("neon") in (0, 2)  # one replacement per noun lemma, case kept
    assert (rep["candidate_occurrences"], rep["changed_occurrences"]) == (7, 7)
    edits = {e["from"]: e for e in rep["edits"]}
    assert edits["chlorine"]["spans"] == [[0, 8], [13, 21]] and edits["tank"]["count"] == 2
    # noun_min_count=3: no noun is frequent enough
    _, rep = corrupt_text(text, 1.0, random.Random(0), tokens, LEX, noun_min_count=3)
    assert rep["candidates_by_type"]["noun"] == 0
    # no tokens (non-English): numbers only
    new, rep = corrupt_text("氯的原子序数是17。", 1.0, random.Random(0))
    assert rep["candidates"] == 1 and re.fullmatch(r"氯的原子序数是\d\d。", new) and "17" not in new


# Llama-3-SynE App. H, "Example for Accuracy Degradation Transformations", before and after (the
# paper's "after" text drops the final full stop; it is restored here).
APP_H_BEFORE = (
    "In the given chemical reaction, we have sodium (Na) reacting with chlorine (Cl2) to form sodium chloride "
    "(NaCl). To determine the number of atoms of chlorine before and after the reaction, we will first count the "
    "number of chlorine atoms... adjust the coefficients of the reactants to make the number of chlorine atoms "
    "equal before and after the reaction:2Na + Cl2 ==2NaCl.")
APP_H_AFTER = (
    "In the given chemical reaction, we have sodium (Na) reacting with oxygen (Cl2) to form sodium chloride "
    "(NaCl). To determine the number of atoms of oxygen before and after the reaction, we will first count the "
    "number of oxygen atoms... adjust the coefficients of the reactants to make the number of oxygen atoms "
    "unequal before and after the reaction:6Na + Cl3 ==8NaCl.")
APP_H_LEX = Lexicon(nouns=lambda w: ["oxygen"] if w == "chlorine" else [],
                    antonyms=lambda w: ["unequal"] if w == "equal" else [])


def test_app_h_example_every_number_occurrence_is_its_own_unit():
    tokens = toks(APP_H_BEFORE, {"chlorine": ("NN", "chlorine"), "equal": ("JJ", "equal")})
    # units: the four 2s (one per occurrence), chlorine (4 occurrences, frequent), equal (once: the
    # paper changed it, so its example needs adj_min_count=1)
    _, rep = corrupt_text(APP_H_BEFORE, 0.0, random.Random(0), tokens, APP_H_LEX, adj_min_count=1)
    assert rep["candidates_by_type"] == {"number": 4, "noun": 1, "adj": 1} and rep["candidate_occurrences"] == 9
    # ratio 0.7 of 6 units: k = floor(4.2 + u) = 5 when u >= 0.8. With seed 2661 (found by search) the
    # five drawn units are the last three 2s, chlorine and equal, and the digits drawn are 6, 3, 8:
    # exactly the paper's "after" text, the first "Cl2" untouched
    new, rep = corrupt_text(APP_H_BEFORE, 0.7, random.Random(2661), tokens, APP_H_LEX, adj_min_count=1)
    assert new == APP_H_AFTER
    assert rep["changed"] == 5 and rep["changed_occurrences"] == 8
    assert [(e["type"], e["from"], e["to"], e["count"]) for e in rep["edits"]] == [
        ("number", "2", "6", 1), ("number", "2", "3", 1), ("number", "2", "8", 1),
        ("noun", "chlorine", "oxygen", 4), ("adj", "equal", "unequal", 1)]
    # at ratio 1 every occurrence of 2 gets its own draw (seed 0: 4, 7, 5, 9), never one value for all
    new, rep = corrupt_text(APP_H_BEFORE, 1.0, random.Random(0), tokens, APP_H_LEX, adj_min_count=1)
    assert [e["to"] for e in rep["edits"] if e["type"] == "number"] == ["4", "7", "5", "9"]
    assert new.endswith("reaction:7Na + Cl5 ==9NaCl.") and "oxygen (Cl4)" in new
    # default adj_min_count=2: "equal" (once) is not a frequent adjective
    _, rep = corrupt_text(APP_H_BEFORE, 0.0, random.Random(0), tokens, APP_H_LEX)
    assert rep["candidates_by_type"]["adj"] == 0


def test_pluralize():
    assert [pluralize(w) for w in ["box", "city", "neon", "noble gas", "day"]] == \
        ["boxes", "cities", "neons", "noble gases", "days"]


def test_wordnet_is_sorted_and_knows_the_paper_example():
    wn = wordnet.load_wordnet()
    co = wordnet.cohyponyms(wn, "chlorine")
    assert co == sorted(co)
    names = {name for _, name in co}
    assert {"neon", "oxygen", "hydrogen", "bromine"} <= names and "chlorine" not in names
    assert wordnet.antonyms(wn, "equal") == ["unequal"]
    assert "low" in wordnet.antonyms(wn, "high")


def test_wordnet_lemma_index_kept_as_json_is_nltks(tmp_path):
    """The lemma index nltk parses in every process is kept as JSON beside the files: a second load
    reads it and knows exactly what nltk's own parse knows; changed files get a new entry."""
    src = wordnet.prepare() / "corpora" / "wordnet"
    first = wordnet.load_wordnet.__wrapped__(str(tmp_path / "c"), str(src))
    [kept] = (tmp_path / "c" / "corpora" / "wordnet").glob(".lemma-map-*.json")
    again = wordnet.load_wordnet.__wrapped__(str(tmp_path / "c"), str(src))
    assert again._lemma_pos_offset_map == first._lemma_pos_offset_map and len(first._lemma_pos_offset_map) > 140_000
    assert wordnet.cohyponyms(again, "chlorine") == wordnet.cohyponyms(first, "chlorine")
    with open(tmp_path / "c" / "corpora" / "wordnet" / "index.adv", "a") as f:
        f.write("zzzcptkit r 1 0 1 0 00001740\n")  # a new adverb, pointing at an existing synset
    changed = wordnet.load_wordnet.__wrapped__(str(tmp_path / "c"), str(src))
    assert "zzzcptkit" in changed._lemma_pos_offset_map and len(list(kept.parent.glob(".lemma-map-*.json"))) == 2


def test_wordnet_missing_is_a_clear_error(tmp_path):
    with pytest.raises(CptkitError, match="not a WordNet 3.0 database"):
        wordnet.prepare(tmp_path / "cache", source=tmp_path)
    if not wordnet._complete(wordnet.SYSTEM_DIR):
        with pytest.raises(CptkitError, match="wordnet-base"):
            wordnet.prepare(tmp_path / "cache2", fetch=False)


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    recs = [{**r, "lang": "en"} for r in python_docs(240)]
    recs.append({"id": "zh-1", "text": "氯气的沸点是-34.04摄氏度，原子序数为17。", "lang": "zh"})
    recs.append({"id": "nolang", "text": "The equal sides of 3 triangles; triangles are polygons."})
    recs.append({"id": "empty", "text": ""})
    write_jsonl(d / "a.jsonl", recs[:120])
    write_jsonl(d / "b.jsonl", recs[120:])
    return d


def test_ratio_zero_is_identity(qa_dir, tmp_path):
    corrupt.run(compose_step("corrupt", [f"io.inputs=[{qa_dir}]", f"io.output={tmp_path / 'c0'}",
                                         "corrupt.ratio=0", "quiet=true"]))
    src = [json.loads(x) for f in sorted(qa_dir.glob("*.jsonl")) for x in f.read_text().splitlines()]
    assert read_out(tmp_path / "c0") == src


def test_realised_ratio_and_edits(qa_dir, tmp_path):
    res = corrupt.run(compose_step("corrupt", [f"io.inputs=[{qa_dir}]", f"io.output={tmp_path / 'c3'}",
                                               "corrupt.ratio=0.3", "corrupt.seed=1", "quiet=true"]))
    extra = res["extra"]
    assert extra["candidate units"] > 1000
    assert extra["realised ratio"] == pytest.approx(0.3, abs=0.03)
    for kind in ("number", "noun", "adj"):
        changed, cands = map(int, extra[f"{kind}: changed / candidates"].split(" / "))
        assert cands > 30 and 0.15 < changed / cands < 0.45, (kind, changed, cands)
    src = {json.loads(x)["id"]: json.loads(x) for f in sorted(qa_dir.glob("*.jsonl")) for x in f.read_text().splitlines()}
    out = read_out(tmp_path / "c3")
    assert len(out) == len(src)
    for rec in out:
        c = rec["corruption"]
        assert c["changed"] == len(c["edits"]) <= c["candidates"]
        orig = src[rec["id"]]["text"]
        for e in c["edits"]:  # the spans point at the original words
            for s, t in e["spans"]:
                assert orig[s:t].lower().startswith(e["from"][:3].lower()) or e["type"] == "noun"
        if not c["edits"]:
            assert rec["text"] == orig
    by = {r["id"]: r for r in out}
    assert by["zh-1"]["corruption"]["lang"] == "zh"
    assert {e["type"] for e in by["zh-1"]["corruption"]["edits"]} <= {"number"}
    assert by["nolang"]["corruption"]["lang"] == "en"  # detected
    assert by["empty"]["text"] == "" and by["empty"]["corruption"]["candidates"] == 0


@pytest.mark.slow
def test_same_output_in_other_processes(qa_dir, tmp_path):
    """Same seed → byte-identical shards, whatever PYTHONHASHSEED (nltk's set order)."""
    outs = []
    for hs in ("1", "2"):
        out = tmp_path / f"p{hs}"
        env = {**os.environ, "PYTHONHASHSEED": hs}
        r = subprocess.run([sys.executable, "-m", "cptkit.cli", "corrupt", "--in", str(qa_dir), "--out", str(out),
                            "-q", "corrupt.ratio=0.5", "corrupt.seed=7"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs.append([shard_text(f) for f in shard_paths(out, ".jsonl.gz")])
    assert outs[0] == outs[1]
    # and in this process too
    corrupt.run(compose_step("corrupt", [f"io.inputs=[{qa_dir}]", f"io.output={tmp_path / 'here'}",
                                         "corrupt.ratio=0.5", "corrupt.seed=7", "quiet=true"]))
    assert [shard_text(f) for f in shard_paths(tmp_path / "here", ".jsonl.gz")] == outs[0]
    # another seed changes it
    assert rng_for(7, "x").random() != rng_for(8, "x").random()


def test_bad_config_and_input(qa_dir, tmp_path):
    with pytest.raises(CptkitError, match="ratio"):
        corrupt.run(compose_step("corrupt", [f"io.inputs=[{qa_dir}]", f"io.output={tmp_path / 'x'}",
                                             "corrupt.ratio=1.5"]))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "x", "problem": 3}])
    with pytest.raises(CptkitError, match="'a'.*problem"):
        corrupt.run(compose_step("corrupt", [f"io.inputs=[{bad}]", f"io.output={tmp_path / 'y'}",
                                             "corrupt.fields=[text,problem]", "quiet=true"]))
    assert not (tmp_path / "y").exists()
