"""The papers' benchmarks as tasks, read offline from small fixture files in each dataset's own format.

tests/fixtures/eval/ holds a few items per benchmark written in the published layouts (MATH's
per-problem JSON tree, MMLU/C-Eval/CMMLU CSVs, AGIEval/GSM8K/ARC/MBPP JSONL, HumanEval .jsonl.gz,
SciQ/SVAMP/MAWPS/MathQA/SciEval JSON lists, ASDiv XML, BIG-Bench-Hard json + cot-prompts).
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import BadInput, CptkitError
from cptkit.eval import formats as F
from cptkit.eval import tasks as T
from tests._eval_model import FIXTURES, TASK_DIR, make_tiny

ALL_TASKS = sorted(p.stem for p in TASK_DIR.glob("*.yaml") if p.stem not in ("gcide_defs", "champ_math"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny-eval"))


def task(name: str, data_dir=FIXTURES) -> T.EvalTask:
    return T.load_task(name, TASK_DIR, data_dir)


def test_every_task_file_is_valid_and_names_what_to_download(tmp_path):
    """Each shipped task loads; with no data it fails with one line naming the download and the place."""
    for name in ALL_TASKS:
        t = task(name, tmp_path)
        with pytest.raises(CptkitError) as e:
            T.load_docs(t, t.spec["test_split"])
        msg = str(e.value)
        assert "\n" not in msg and f"eval task {t.name}: no data" in msg and str(tmp_path) in msg, msg
        assert "download" in msg or "git clone" in msg or "put " in msg, msg


# --- multiple choice ------------------------------------------------------------------------------
def test_mmlu_csv_first_n_shots_from_the_same_subject():
    t = task("mmlu")
    docs = T.load_docs(t, "test")
    assert [d["subject"] for d in docs] == ["abstract_algebra"] * 3 + ["anatomy"] * 3
    assert docs[0]["choices"] == ["one", "two", "three", "four"] and [d["answer"] for d in docs[:4]] == [3, 2, 1, 3]
    assert docs[0]["question"] == "abstract_algebra test question 0, with a comma"  # quoted CSV field
    ctx = T.contexts(t, [docs[3]], 2, seed=1)[0]
    assert ctx == ("The following are multiple choice questions (with answers) about anatomy.\n\n"
                   "anatomy dev q0\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n"
                   "anatomy dev q1\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\n"
                   "anatomy test question 0, with a comma\nA. one\nB. two\nC. three\nD. four\nAnswer:")


def test_mmlu_stem_needs_its_nineteen_subjects():
    with pytest.raises(CptkitError, match=r"missing astronomy, college_biology.*download https://people.eecs"):
        T.load_docs(task("mmlu_stem"), "test")


def test_ceval_cmmlu_agieval_arc_mathqa_scieval_gold_indices():
    ce = task("ceval")
    d = T.load_docs(ce, "val")
    assert [T.gold_index(ce, x, T.doc_to_choice(ce, x)) for x in d] == [1, 2]
    assert T.contexts(ce, d[:1], 1, 0)[0].startswith("以下是中国关于computer_network的单项选择题，请选出其中的正确答案。\n\n"
                                                     "计算机网络中 TCP 是哪一层协议？\nA. 传输层")
    cm = task("cmmlu")
    assert [T.gold_index(cm, x, T.doc_to_choice(cm, x)) for x in T.load_docs(cm, "test")] == [1]
    gk = task("gaokao_biology")
    g = T.load_docs(gk, "test")
    assert [x["label"] for x in g] == [0, 1] and g[1]["choices"] == ["黑暗", "光", "噪音", "塑料"]  # ["A"] and "B"
    assert T.doc_to_choice(gk, g[0]) == ["(A)", "(B)", "(C)", "(D)"]
    assert T.doc_to_text(gk, g[1]) == "问题：光合作用需要什么？ 选项：(A)黑暗 (B)光 (C)噪音 (D)塑料 \n答案：从A到D, 我们应选择"
    aq = task("aqua_rat")
    a = T.load_docs(aq, "test")[0]
    assert T.doc_to_choice(aq, a) == ["(A)", "(B)", "(C)", "(D)", "(E)"] and a["choices"][0] == "30"
    arc = task("arc_easy")
    ad = T.load_docs(arc, "test")
    assert ad[1]["choices"] == {"text": ["meter", "kilogram", "second"], "label": ["1", "2", "3"]}
    assert [T.gold_index(arc, x, T.doc_to_choice(arc, x)) for x in ad] == [2, 1]  # answerKey "C" and "2"
    mq = task("mathqa")
    m = T.load_docs(mq, "test")
    assert m[0]["choices"] == ["38", "27.675", "30", "data inadequate", "none of these"] and m[0]["label"] == 1
    se = task("scieval")
    s = T.load_docs(se, "valid")
    assert [x["label"] for x in s] == [0, 1, 2] and s[0]["question"] == "What is the SI unit of force?"  # judge item dropped
    assert [x["category"] for x in T.load_docs(task("scieval_chemistry"), "valid")] == ["chemistry"]
    sq = task("sciq")
    assert T.gold_index(sq, T.load_docs(sq, "test")[0], T.doc_to_choice(sq, T.load_docs(sq, "test")[0])) == 3


# --- generative with answer extraction -----------------------------------------------------------------
def test_math_has_all_seven_subjects_and_a_missing_one_is_an_error(tmp_path):
    t = task("math")
    docs = T.load_docs(t, "test")
    assert sorted({d["subject"] for d in docs}) == sorted(F.MATH_SUBJECTS) and len(docs) == 14
    assert T.extract(docs[0]["solution"], "boxed") == "3"
    shutil.copytree(FIXTURES / "MATH", tmp_path / "MATH")
    shutil.rmtree(tmp_path / "MATH" / "test" / "geometry")
    with pytest.raises(CptkitError) as e:
        T.load_docs(task("math", tmp_path), "test")
    msg = str(e.value)
    assert "MATH subject geometry" in msg and "all seven subjects" in msg and "MATH.tar" in msg and "\n" not in msg


def test_generative_golds_and_extractions():
    gs = task("gsm8k")
    d = T.load_docs(gs, "test")[0]
    assert T.extract(d["answer"], "last_number") == "1234"  # "#### 1,234"
    assert T.extract("so the total is 1,234 pens.", "last_number") == "1234"
    assert [x["answer"] for x in T.load_docs(task("asdiv"), "test")[:2]] == ["8", "9"]  # "8 (apples)"
    assert T.answer_text(task("svamp"), T.load_docs(task("svamp"), "test")[0]) == "8"  # 8.0 shown as 8
    assert T.answer_text(task("mawps"), T.load_docs(task("mawps"), "test")[0]) == "3"
    mv = task("minerva_math")
    shots = T.load_docs(mv, "fewshot")
    assert len(shots) == 4 and T.extract(shots[0]["solution"], "minerva") == "[2,5)"
    assert T.extract("so x = 4.\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "minerva") == "1/2"
    bbh = task("bbh")
    bd = T.load_docs(bbh, "test")
    ctx = T.contexts(bbh, bd[:1], 3, 0)[0]
    assert ctx.startswith("Evaluate the result of a random Boolean expression.\n\nQ: not ( ( not not True ) ) is\n"
                          "A: Let's think step by step.")
    assert ctx.count("Q: ") == 4 and ctx.endswith("Q: not ( True ) and ( True ) is\nA:")
    method = bbh.spec["answer_extraction"]
    assert T.extract(" Let's think step by step. not True = False. So the answer is False.", method) == "False"
    assert T.extract("So the answer is (B).\n", method) == "(B)"


def test_bad_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "mmlu" / "data" / "test"
    bad.mkdir(parents=True)
    (bad / "anatomy_test.csv").write_text("q,a,b,c,d,A\nq2,a,b,c,d,E\n")
    with pytest.raises(BadInput, match=r"anatomy_test.csv:2: expected question,A,B,C,D,answer-letter"):
        F.mmlu_csv(bad, "test", {})
    (tmp_path / "x.jsonl").write_text('{"question": 1}\nnot json\n')
    with pytest.raises(BadInput, match=r"x.jsonl:2: malformed JSON"):
        F.read_jsonl(tmp_path / "x.jsonl")


def test_code_tasks_read_their_published_files():
    he = T.load_docs(task("humaneval"), "test")
    assert [d["entry_point"] for d in he] == ["add", "is_even"]
    mb = task("mbpp")
    assert [d["task_id"] for d in T.load_docs(mb, "test")] == [11, 12]
    assert [d["task_id"] for d in T.load_docs(mb, "fewshot")] == [2, 3, 4]
    ctx = T.contexts(mb, T.load_docs(mb, "test")[:1], 3, 0)[0]
    assert ctx.count("[BEGIN]\n") == 4 and ctx.count("[DONE]") == 3 and "def similar_elements(a, b)" in ctx
    assert ctx.endswith("assert square(0) == 0\n[BEGIN]\n")


# --- end to end through the CLI -------------------------------------------------------------------------
def test_evaluate_runs_each_family_offline_with_stderr_on_every_metric(tiny, tmp_path):
    model_dir, _, _ = tiny
    out = tmp_path / "ev"
    res = CliRunner().invoke(app, [
        "evaluate", "--model", str(model_dir), "--out", str(out), "-q", f"eval.data_dir={FIXTURES}",
        "eval.tasks=[mmlu,gsm8k,humaneval,asdiv]", "eval.task_shots={gsm8k: 2, asdiv: 3}", "eval.max_gen_toks=8"])
    assert res.exit_code == 0, res.output
    r = json.loads((out / "_results.json").read_text())
    assert r["tasks"]["gsm8k"]["metrics"]["num_fewshot"] == 2 and r["tasks"]["asdiv"]["metrics"]["num_fewshot"] == 3
    assert r["tasks"]["mmlu"]["metrics"]["num_fewshot"] == 5 and r["tasks"]["mmlu"]["metrics"]["n"] == 6
    for name, e in r["tasks"].items():
        m = e["metrics"]
        scores = [k for k in m if k in ("acc", "acc_norm", "exact_match") or (k.startswith("pass@") and "_" not in k)]
        assert scores and all(isinstance(m[f"{k}_stderr"], float) for k in scores), (name, m)
    he = r["tasks"]["humaneval"]["metrics"]
    assert he["n"] == 2 and 0.0 <= he["pass@1"] <= 1.0


def test_missing_data_exits_2_with_one_line_and_writes_nothing(tiny, tmp_path):
    model_dir, _, _ = tiny
    res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "o"),
                                   f"eval.data_dir={tmp_path}", "eval.tasks=[math]"])
    assert res.exit_code != 0 and isinstance(res.exception, CptkitError) and res.exception.exit_code == 2
    assert "MATH.tar" in str(res.exception) and not (tmp_path / "o").exists()


def test_unreachable_hub_is_the_same_one_line_error_without_retries(tiny, tmp_path, monkeypatch):
    """Online mode (no HF_HUB_OFFLINE) on a machine that cannot reach the hub: the missing-data
    line at once, naming the hub dataset, instead of datasets' logged retries."""
    import socket

    from cptkit.eval import tasks

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    tasks.hub_reachable.cache_clear()
    model_dir, _, _ = tiny
    try:
        res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "o"),
                                       f"eval.data_dir={tmp_path}", "eval.tasks=[mmlu]"])
    finally:
        tasks.hub_reachable.cache_clear()
    assert isinstance(res.exception, CptkitError) and res.exception.exit_code == 2
    msg = str(res.exception)
    assert "unreachable" in msg and "cais/mmlu" in msg and "\n" not in msg and not (tmp_path / "o").exists()
