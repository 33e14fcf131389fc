"""Scores you can trust: batch-size invariance, agreement with lm-evaluation-harness (also as an engine),
clean/contaminated split, paper scorecards, quiet output. A tiny real Llama saved to disk, fixture data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.eval import fewshot, runner, task_data, tasks
from cptkit.eval.compare import compare_table, suite_table, to_markdown
from cptkit.models import lm
from tests._eval_model import FIXTURES, TASK_DIR, make_tiny

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d, _, _ = make_tiny(tmp_path_factory.mktemp("tiny-agree"))
    return d, lm.load_tokenizer(str(d)), lm.load_causal_lm(str(d))


def task(name: str) -> tasks.EvalTask:
    return tasks.load_task(name, TASK_DIR, FIXTURES)


# --- batch size -------------------------------------------------------------------------------------
def test_scores_identical_for_batch_sizes_1_8_32(tiny):
    _, tok, model = tiny
    runs = {}
    for bs in (1, 8, 32):
        mc, mc_items = runner.run_task(model, tok, task("mmlu"), batch_size=bs)
        sci, sci_items = runner.run_task(model, tok, task("scieval"), batch_size=bs, num_fewshot=2)
        gen, gen_items = runner.run_task(model, tok, task("gsm8k"), batch_size=bs, num_fewshot=2, max_gen_toks=12)
        runs[bs] = (mc, mc_items, sci, sci_items, gen, gen_items)
    (mc1, items1, sci1, sitems1, gen1, gitems1) = runs[1]
    assert len(items1) == 6 and len(gitems1) == 3
    for bs in (8, 32):
        mc, items, sci, sitems, gen, gitems = runs[bs]
        for a, b in ((mc1, mc), (sci1, sci), (gen1, gen)):
            assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
        for x, y in zip(items1 + sitems1, items + sitems, strict=True):
            assert (x["pred"], x["pred_norm"]) == (y["pred"], y["pred_norm"])
            assert x["lls"] == pytest.approx(y["lls"], abs=1e-4)
        assert [g["output"] for g in gitems1] == [g["output"] for g in gitems]  # left padding + mask: same text
    assert any(g["output"].strip() for g in gitems1)  # the model did generate something


# --- lm-evaluation-harness ------------------------------------------------------------------------------
LM_EVAL_MC = """task: cptkit_mmlu_agree
dataset_path: json
dataset_kwargs:
  data_files:
    dev: {dev}
    test: {test}
output_type: multiple_choice
test_split: test
fewshot_split: dev
fewshot_config:
  sampler: first_n
num_fewshot: 3
description: "The following are multiple choice questions (with answers) about anatomy.\\n\\n"
doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{choices[0]}}}}\\nB. {{{{choices[1]}}}}\\nC. {{{{choices[2]}}}}\\nD. {{{{choices[3]}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""

LM_EVAL_GSM8K = """task: cptkit_gsm8k_agree
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: generate_until
training_split: train
test_split: test
fewshot_split: train
num_fewshot: 2
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>", "\\n\\n"]
  do_sample: false
  max_gen_toks: 12
filter_list:
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
"""


def _mmlu_as_jsonl(tmp: Path) -> tuple[Path, Path]:
    """The MMLU fixture (published CSV) as HF-layout JSONL for lm-eval's `dataset_path: json`, one subject."""
    t = task("mmlu")
    dev = [d for d in task_data.load_docs(t, "dev") if d["subject"] == "anatomy"]
    test = [d for d in task_data.load_docs(t, "test") if d["subject"] == "anatomy"]
    for name, rows in (("dev", dev), ("test", test)):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp / "dev.jsonl", tmp / "test.jsonl"


def _lm_eval_dir(tmp: Path) -> Path:
    d = tmp / "lm_eval_tasks"
    d.mkdir()
    dev, test = _mmlu_as_jsonl(tmp)
    (d / "mc.yaml").write_text(LM_EVAL_MC.format(dev=dev, test=test))
    (d / "gsm.yaml").write_text(LM_EVAL_GSM8K.format(train=FIXTURES / "gsm8k/train.jsonl", test=FIXTURES / "gsm8k/test.jsonl"))
    return d


@pytest.mark.slow
def test_engines_agree_on_multiple_choice_and_gsm8k_exact_match(tiny, tmp_path):
    """`evaluate` (cptkit engine) and `evaluate eval.engine=lm_eval` on the same saved model and data."""
    pytest.importorskip("lm_eval")
    model_dir, _, _ = tiny
    inc = _lm_eval_dir(tmp_path)
    common = ["evaluate", "--model", str(model_dir), "-q", "eval.batch_size=4", "eval.fewshot_seed=1234"]
    res = CliRunner().invoke(app, common + ["--out", str(tmp_path / "lm"), "eval.engine=lm_eval",
                                            f"eval.lm_eval.include_path={inc}",
                                            "eval.tasks=[cptkit_mmlu_agree,cptkit_gsm8k_agree]"])
    assert res.exit_code == 0, res.output
    theirs = json.loads((tmp_path / "lm" / "_results.json").read_text())["tasks"]
    # the same tasks as cptkit task files (MMLU from its CSVs, one subject; GSM8K with 2 shots)
    mc = (TASK_DIR / "mmlu.yaml").read_text().replace("fewshot_group: subject", "fewshot_group: subject\n"
                                                      "format_options: {subjects: [anatomy]}")
    mc = mc.replace("task: mmlu\n", "task: mmlu_anatomy\n")
    (tmp_path / "mmlu_anatomy.yaml").write_text(mc)
    res = CliRunner().invoke(app, common + ["--out", str(tmp_path / "ours"), f"eval.data_dir={FIXTURES}",
                                            f"eval.tasks=[{tmp_path / 'mmlu_anatomy.yaml'},gsm8k]", "eval.shots=null",
                                            "eval.task_shots={mmlu_anatomy: 3, gsm8k: 2}", "eval.max_gen_toks=12"])
    assert res.exit_code == 0, res.output
    ours = json.loads((tmp_path / "ours" / "_results.json").read_text())["tasks"]
    a, b = ours["mmlu_anatomy"]["metrics"], theirs["cptkit_mmlu_agree"]["metrics"]
    assert a["n"] == b["n"] == 3 and a["num_fewshot"] == b["num_fewshot"] == 3
    assert a["acc"] == b["acc"] and a["acc_norm"] == b["acc_norm"]
    assert a["acc_stderr"] == pytest.approx(b["acc_stderr"])
    # the same prompts, description and per-subject first_n shots included
    from cptkit.core.shards import read_records, resolve_inputs

    def texts(d: Path, name: str) -> list[str]:
        rs = (r for f in resolve_inputs(str(d)) for r in read_records(f) if r["task"] == name)
        return [r["text"] for r in sorted(rs, key=lambda r: r["doc"])]

    mine = fewshot.contexts(tasks.load_task(str(tmp_path / "mmlu_anatomy.yaml"), TASK_DIR, FIXTURES),
                            task_data.load_docs(tasks.load_task(str(tmp_path / "mmlu_anatomy.yaml"), TASK_DIR, FIXTURES), "test"), 3, 1234)
    assert texts(tmp_path / "lm", "cptkit_mmlu_agree") == mine
    g, h = ours["gsm8k"]["metrics"], theirs["cptkit_gsm8k_agree"]["metrics"]
    assert g["n"] == h["n"] == 3 and g["exact_match"] == h["exact_match/flexible-extract"]
    # item by item: the same generated text, hence the same extracted answers

    def items(d: Path, name: str) -> list[dict]:
        return sorted((r for f in resolve_inputs(str(d)) for r in read_records(f) if r["task"] == name),
                      key=lambda r: r["doc"])

    our_out = [r["output"] for r in items(tmp_path / "ours", "gsm8k")]
    their = items(tmp_path / "lm", "cptkit_gsm8k_agree")
    assert len(our_out) == 3 and our_out == [str(r["resps"][0]) for r in their]


# --- clean / contaminated split ----------------------------------------------------------------------------
def test_clean_and_contaminated_items_scored_separately(tiny, tmp_path):
    model_dir, _, _ = tiny
    gsm = task_data.load_docs(task("gsm8k"), "test")
    stream = tmp_path / "stream.jsonl"
    stream.write_text(json.dumps({"id": "leak", "text": "forum post: " + gsm[1]["question"] + " " + gsm[1]["answer"]}) + "\n"
                      + json.dumps({"id": "clean", "text": "A paragraph about harbours and shipping containers."}) + "\n")
    res = CliRunner().invoke(app, ["evaluate-contamination", "--in", str(stream), "--out", str(tmp_path / "c"), "-q",
                                   "eval.tasks=[gsm8k]", f"eval.data_dir={FIXTURES}", "eval.ngram=8"])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "c" / "_contamination.json").read_text())["benchmarks"]["gsm8k"]
    assert rep["test_items_hit_ids"] == ["1"] and rep["docs_contaminated"] == 1
    res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "e"), "-q",
                                   f"eval.data_dir={FIXTURES}", "eval.tasks=[gsm8k]", "eval.shots=1",
                                   "eval.max_gen_toks=4", f"eval.contamination={tmp_path / 'c'}"])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "e" / "_results.json").read_text())
    sp = r["tasks"]["gsm8k"]["split"]
    assert sp["clean"]["n"] == 2 and sp["contaminated"]["n"] == 1
    m = r["tasks"]["gsm8k"]["metrics"]
    assert (2 * sp["clean"]["exact_match"] + sp["contaminated"]["exact_match"]) / 3 == pytest.approx(m["exact_match"])
    # a report without the task is one clear line
    res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "e2"),
                                   f"eval.data_dir={FIXTURES}", "eval.tasks=[asdiv]", f"eval.contamination={tmp_path / 'c'}"])
    assert res.exit_code != 0 and "no benchmark 'asdiv'" in str(res.exception) and not (tmp_path / "e2").exists()


def test_split_metrics_by_hand():
    items = [{"id": "a", "acc": 1.0}, {"id": "b", "acc": 0.0}, {"id": "c", "acc": 1.0}, {"id": "d", "acc": 1.0}]
    sp = runner.split_metrics(items, {"b", "d"})
    assert sp["clean"] == {"acc": 1.0, "acc_stderr": 0.0, "n": 2}
    assert sp["contaminated"]["acc"] == 0.5 and sp["contaminated"]["acc_stderr"] == pytest.approx(0.5)  # sqrt(0.5/2)
    assert runner.split_metrics(items, set())["contaminated"] == {"acc": None, "acc_stderr": None, "n": 0}


# --- scorecards -------------------------------------------------------------------------------------------
def _res(suite_file: str, scores: dict[str, dict[str, float]]) -> dict:
    return {"suite": {"name": "x", "file": suite_file}, "tasks": {t: {"metrics": m} for t, m in scores.items()}}


# Table 8 of the upsampling paper (App. A): the Gauntlet v0.3 benchmarks per category, with the metric cptkit
# scores each by and its random baseline (MosaicML's eval_gauntlet_v0.3.yaml, the configuration the paper ran)
GAUNTLET_V03 = {
    "World Knowledge": [("jeopardy", "acc", 0), ("mmlu", "acc", 0.25), ("bigbench_qa_wikidata", "acc", 0),
                        ("arc_easy", "acc", 0.25), ("arc_challenge", "acc", 0.25), ("triviaqa_sub", "exact_match", 0)],
    "Commonsense Reasoning": [("bigbench_strategyqa", "acc", 0.5), ("bigbench_strange_stories", "acc", 0.5),
                              ("copa", "acc", 0.5), ("piqa", "acc", 0.5), ("siqa", "acc", 0.5),
                              ("openbookqa", "acc", 0.25), ("commonsense_qa", "acc", 0.25)],
    "Language Understanding": [("lambada_openai", "acc", 0), ("hellaswag", "acc", 0.25), ("winograd", "acc", 0.5),
                               ("winogrande", "acc", 0.5)],
    "Symbolic Problem Solving": [("bigbench_elementary_math_qa", "acc", 0.25), ("bigbench_dyck_languages", "acc", 0),
                                 ("bigbench_operators", "acc", 0), ("simple_arithmetic_withspaces", "acc", 0),
                                 ("simple_arithmetic_nospaces", "acc", 0), ("gsm8k", "exact_match", 0),
                                 ("svamp", "exact_match", 0), ("agieval_lsat_ar", "acc", 0.25)],
    "Reading Comprehension": [("squad", "acc", 0), ("boolq", "acc", 0.5), ("coqa", "acc", 0),
                              ("agieval_lsat_rc", "acc", 0.25), ("agieval_lsat_lr", "acc", 0.25),
                              ("agieval_sat_en", "acc", 0.25)],
    "Programming": [("humaneval", "pass@1", 0)],
}
PAPER_SHOTS = {"jeopardy": 3, "mmlu": 5, "bigbench_qa_wikidata": 3, "arc_easy": 3, "arc_challenge": 3, "triviaqa_sub": 3,
               "bigbench_strategyqa": 0, "bigbench_strange_stories": 0, "copa": 0, "piqa": 10, "siqa": 3,
               "openbookqa": 10, "commonsense_qa": 0, "lambada_openai": 0, "hellaswag": 0, "winograd": 3,
               "winogrande": 5, "bigbench_elementary_math_qa": 1, "bigbench_dyck_languages": 5, "bigbench_operators": 3,
               "simple_arithmetic_withspaces": 5, "simple_arithmetic_nospaces": 5, "gsm8k": 8, "svamp": 5,
               "agieval_lsat_ar": 5, "squad": 3, "boolq": 0, "coqa": 0, "agieval_lsat_rc": 5, "agieval_lsat_lr": 5,
               "agieval_sat_en": 5, "humaneval": 0}


def gauntlet_by_hand(tasks: dict[str, dict]) -> dict[str, float]:
    """Each category: the mean of (score - baseline) / (1 - baseline), in %; Core Average: the mean of the six."""
    cats = {c: 100 * sum((tasks[t]["metrics"][m] - b) / (1 - b) for t, m, b in bench) / len(bench)
            for c, bench in GAUNTLET_V03.items()}
    return cats | {"Core Average": sum(cats.values()) / len(cats)}


def test_suite_layouts_and_gauntlet_rescaling():
    import yaml

    up = yaml.safe_load((ROOT / "conf/eval/suites/upsampling.yaml").read_text())
    assert up["tasks"] == PAPER_SHOTS  # every benchmark of Table 8, with the paper's shots
    scores = {"mmlu": {"acc": 0.40}, "gsm8k": {"exact_match": 0.10}, "humaneval": {"pass@1": 0.20},
              "arc_easy": {"acc": 0.70}, "arc_challenge": {"acc": 0.40}, "svamp": {"exact_match": 0.30},
              "agieval_lsat_ar": {"acc": 0.20}, "agieval_lsat_rc": {"acc": 0.40}, "agieval_lsat_lr": {"acc": 0.30},
              "agieval_sat_en": {"acc": 0.55}, "jeopardy": {"acc": 0.10}, "bigbench_qa_wikidata": {"acc": 0.20},
              "triviaqa_sub": {"exact_match": 0.30}, "bigbench_strategyqa": {"acc": 0.75},
              "bigbench_strange_stories": {"acc": 0.50}, "copa": {"acc": 0.80}, "piqa": {"acc": 0.70},
              "siqa": {"acc": 0.60}, "openbookqa": {"acc": 0.40}, "commonsense_qa": {"acc": 0.36},
              "lambada_openai": {"acc": 0.30}, "hellaswag": {"acc": 0.55}, "winograd": {"acc": 0.60},
              "winogrande": {"acc": 0.55}, "bigbench_elementary_math_qa": {"acc": 0.40},
              "bigbench_dyck_languages": {"acc": 0.10}, "bigbench_operators": {"acc": 0.20},
              "simple_arithmetic_withspaces": {"acc": 0.50}, "simple_arithmetic_nospaces": {"acc": 0.40},
              "squad": {"acc": 0.50}, "boolq": {"acc": 0.70}, "coqa": {"acc": 0.20}}
    header, rows = suite_table(up, {"1T": _res("u", scores)})
    assert header == ["benchmark", "1T"]
    got = {r[0]: r[1] for r in rows}
    assert got["MMLU (5-shot)"] == pytest.approx(40.0) and got["HumanEval (pass@1)"] == pytest.approx(20.0)
    g = "Gauntlet v0.3 / "
    # World Knowledge: jeopardy 10, MMLU (0.40-.25)/.75 = 20, wikidata 20, ARC-e 60, ARC-c 20, TriviaQA 30
    assert got[g + "World Knowledge"] == pytest.approx(160 / 6)
    # Commonsense: StrategyQA 50, Strange Stories 0, COPA 60, PIQA 40, SIQA (.6-.5)/.5 = 20, OBQA 20,
    # CSQA (.36-.25)/.75 = 44/3
    assert got[g + "Commonsense Reasoning"] == pytest.approx((190 + 44 / 3) / 7)
    assert got[g + "Language Understanding"] == pytest.approx((30 + 40 + 20 + 10) / 4)
    # Symbolic: elementary math 20, dyck 10, operators 20, arithmetic 50 and 40, GSM8K 10, SVAMP 30,
    # LSAT-AR (.2-.25)/.75 = -20/3 (below chance counts below zero)
    assert got[g + "Symbolic Problem Solving"] == pytest.approx((180 - 20 / 3) / 8)
    # Reading: SQuAD 50, BoolQ 40, CoQA 20, LSAT-RC (.4-.25)/.75 = 20, LSAT-LR 20/3, SAT-En (.55-.25)/.75 = 40
    assert got[g + "Reading Comprehension"] == pytest.approx((170 + 20 / 3) / 6)
    assert got[g + "Programming"] == pytest.approx(20.0)
    core = (160 / 6 + (190 + 44 / 3) / 7 + 25 + (180 - 20 / 3) / 8 + (170 + 20 / 3) / 6 + 20) / 6
    assert got[g + "Core Average"] == pytest.approx(core)
    assert {k: got[g + k] for k in GAUNTLET_V03} | {"Core Average": got[g + "Core Average"]} == pytest.approx(
        gauntlet_by_hand({t: {"metrics": m} for t, m in scores.items()}))
    # a benchmark missing: its category and the Core Average are empty, not averaged over what is there
    _, rows = suite_table(up, {"1T": _res("u", {k: v for k, v in scores.items() if k != "coqa"})})
    got = {r[0]: r[1] for r in rows}
    assert got[g + "Reading Comprehension"] is None and got[g + "Core Average"] is None
    assert got[g + "World Knowledge"] == pytest.approx(160 / 6)
    vt = yaml.safe_load((ROOT / "conf/eval/suites/velocitune.yaml").read_text())
    base = {"gsm8k": {"exact_match": 0.124}, "math": {"exact_match": 0.06}, "minerva_math": {"exact_match": 0.052},
            "mathqa": {"acc": 0.141}, "asdiv": {"exact_match": 0.505}, "svamp": {"exact_match": 0.445},
            "mmlu_stem": {"acc": 0.209}, "sat_math": {"acc": 0.188}, "humaneval": {"pass@1": 0.305}, "mbpp": {"pass@1": 0.432}}
    cpt = dict(base) | {"gsm8k": {"exact_match": 0.284}}
    header, rows = suite_table(vt, {"CodeLlama": _res("v", base), "Velocitune": _res("v", cpt)})
    assert header[1:4] == ["Math\nGSM8K", "Math\nMATH", "Math\nMinerva"] and header[12] == "Code\nCode Avg."
    # Table 2 beside it: CmdGen-NVIDIA and CmdGen-AMD, six columns each, empty for runs without CmdGen
    assert header[13:] == [f"CmdGen-{b}\n{m}" for b in ("NVIDIA", "AMD")
                           for m in ("Cmd Sim", "Output Sim", "Approx Acc", "EM", "SR", "Acc")]
    assert rows[0][13:] == [None] * 12
    # the paper's CodeLlama row: Avg. 21.6 and Code Avg. 36.8 (Velocitune Table 1)
    assert round(rows[0][9], 1) == 21.6 and round(rows[0][12], 2) == 36.85
    assert rows[1][0] == "Velocitune" and rows[2][0].strip().startswith("Δ") and rows[2][1] == pytest.approx(16.0)
    assert "| run | Math / GSM8K |" in to_markdown(header, rows)
    for name in ("synE", "retrieve_pile", "velocitune"):
        s = yaml.safe_load((ROOT / f"conf/eval/suites/{name}.yaml").read_text())
        cols = [c.get("task") for t in s["tables"] for g in t["groups"] for c in g["columns"] if "task" in c]
        assert set(cols) <= set(s["tasks"]) and all((TASK_DIR / f"{c}.yaml").exists() for c in s["tasks"])


def test_suite_run_and_compare_in_the_papers_layout(tiny, tmp_path):
    model_dir, _, _ = tiny
    suite = tmp_path / "mini.yaml"
    suite.write_text("suite: mini\ntitle: mini table\ntasks: {mmlu: 2, sciq: 1}\n"
                     "tables:\n  - title: T\n    groups:\n      - name: G\n        columns:\n"
                     "          - {label: MMLU, task: mmlu, metric: acc}\n          - {label: SciQ, task: sciq, metric: acc_norm}\n"
                     "          - {label: Avg., mean: [MMLU, SciQ]}\n")
    for run in ("a", "b"):
        res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / run), "-q",
                                       f"eval.data_dir={FIXTURES}", f"eval.suite={suite}"])
        assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "a" / "_results.json").read_text())
    assert r["suite"]["name"] == "mini" and r["tasks"]["mmlu"]["metrics"]["num_fewshot"] == 2
    assert r["tasks"]["sciq"]["metrics"]["num_fewshot"] == 1
    header, rows = compare_table({"a": r, "b": json.loads((tmp_path / "b" / "_results.json").read_text())})
    assert header == ["run", "G\nMMLU", "G\nSciQ", "G\nAvg."]
    assert rows[0][1] == pytest.approx(100 * r["tasks"]["mmlu"]["metrics"]["acc"]) and rows[2][1:] == [0.0, 0.0, 0.0]
    assert rows[0][3] == pytest.approx((rows[0][1] + rows[0][2]) / 2)
    cmp = CliRunner().invoke(app, ["evaluate-compare", f"base={tmp_path / 'a'}", f"cpt={tmp_path / 'b'}",
                                   "--out", str(tmp_path / "t.md")])
    assert cmp.exit_code == 0, cmp.output
    md = (tmp_path / "t.md").read_text().splitlines()
    assert md[0] == "| run | G / MMLU | G / SciQ | G / Avg. |" and md[4].startswith("|   Δ vs base | +0.00 |")


def test_upsampling_suite_runs_on_fixtures_with_six_categories_and_core_average(tiny, tmp_path):
    """`evaluate eval.suite=upsampling` on every Gauntlet v0.3 benchmark's fixture: the six categories and
    the Core Average of the printed table are the paper's formula applied to the run's own task scores."""
    import shutil

    from cptkit.steps.evaluate import load_suite

    model_dir, _, _ = tiny
    data = tmp_path / "data"
    shutil.copytree(FIXTURES, data)  # simple_arithmetic is built into it on first use
    res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "o"),
                                   f"eval.data_dir={data}", "eval.suite=upsampling", "eval.shots=1",
                                   "eval.limit=3", "eval.max_gen_toks=4"])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "o" / "_results.json").read_text())
    assert set(r["tasks"]) == set(PAPER_SHOTS) and r["suite"]["name"] == "upsampling"
    assert (data / "simple_arithmetic/test.jsonl").exists()
    assert {r["tasks"][t]["output_type"] for t in ("lambada_openai", "squad", "coqa", "jeopardy")} == {"loglikelihood"}
    header, rows = suite_table(load_suite("upsampling"), {"this run": r})
    got = {row[0]: row[1] for row in rows}
    cats = [k.removeprefix("Gauntlet v0.3 / ") for k in got if k.startswith("Gauntlet v0.3 / ")]
    assert cats == [*GAUNTLET_V03, "Core Average"]
    hand = gauntlet_by_hand(r["tasks"])
    for c in cats:
        assert got["Gauntlet v0.3 / " + c] == pytest.approx(hand[c]), c
    assert hand["Core Average"] == pytest.approx(sum(hand[c] for c in GAUNTLET_V03) / 6)
    for c in cats:  # the printed table
        assert c in res.output


# --- quiet ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_quiet_prints_no_table(tiny, tmp_path):
    model_dir, _, _ = tiny
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", COLUMNS="200")
    base = [sys.executable, "-m", "cptkit.cli", "evaluate", "--model", str(model_dir), f"eval.data_dir={FIXTURES}",
            "eval.tasks=[sciq]", "eval.shots=0"]
    loud = subprocess.run(base + ["--out", str(tmp_path / "loud")], capture_output=True, text=True, env=env)
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "benchmarks" in loud.stderr and "acc_norm" in loud.stderr
    quiet = subprocess.run(base + ["--out", str(tmp_path / "quiet"), "-q"], capture_output=True, text=True, env=env)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "benchmarks" not in quiet.stderr and "acc_norm" not in quiet.stderr + quiet.stdout
    assert (tmp_path / "quiet" / "_results.json").exists()


@pytest.mark.slow(minutes=1.5)
def test_gsm8k_exact_match_agrees_with_lm_eval_on_smollm2(smollm2, tmp_path):
    """A real model that gets some GSM8K-format items right: same outputs and the same (non-zero) exact match."""
    pytest.importorskip("lm_eval")
    inc = _lm_eval_dir(tmp_path)
    common = ["evaluate", "--model", smollm2, "-q", "eval.batch_size=4", "eval.max_gen_toks=40"]
    res = CliRunner().invoke(app, common + ["--out", str(tmp_path / "lm"), "eval.engine=lm_eval",
                                            f"eval.lm_eval.include_path={inc}", "eval.tasks=[cptkit_gsm8k_agree]"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, common + ["--out", str(tmp_path / "ours"), f"eval.data_dir={FIXTURES}",
                                            "eval.tasks=[gsm8k]", "eval.shots=2"])
    assert res.exit_code == 0, res.output
    theirs = json.loads((tmp_path / "lm" / "_results.json").read_text())["tasks"]["cptkit_gsm8k_agree"]["metrics"]
    ours = json.loads((tmp_path / "ours" / "_results.json").read_text())["tasks"]["gsm8k"]["metrics"]
    assert ours["n"] == theirs["n"] == 3
    assert ours["exact_match"] == theirs["exact_match/flexible-extract"] > 0
    assert ours["exact_match_stderr"] == pytest.approx(theirs["exact_match/flexible-extract_stderr"])
