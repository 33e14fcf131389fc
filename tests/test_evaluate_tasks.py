"""The papers' benchmarks as tasks, read offline from small fixture files in each dataset's own format.

tests/fixtures/eval/ holds a few items per benchmark written in the published layouts (MATH's
per-problem JSON tree, MMLU/C-Eval/CMMLU CSVs, AGIEval/GSM8K/ARC/MBPP JSONL, HumanEval .jsonl.gz,
SciQ/SVAMP/MAWPS/MathQA/SciEval JSON lists, ASDiv XML, BIG-Bench-Hard json + cot-prompts) and the
Gauntlet v0.3 benchmarks (PIQA/SIQA jsonl + labels .lst, SuperGLUE COPA/BoolQ, OpenBookQA/CommonsenseQA,
HellaSwag, WinoGrande, LAMBADA jsonl, BIG-bench task.json, WSCollection.xml, SQuAD/CoQA/TriviaQA/Jeopardy JSON).
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import BadInput, CptkitError
from cptkit.eval import answers, fewshot, runner, task_data, tasks, templates
from cptkit.eval import formats as F
from tests._eval_model import FIXTURES, TASK_DIR, make_tiny

ALL_TASKS = sorted(p.stem for p in TASK_DIR.glob("*.yaml") if "\nbuilder:" not in p.read_text())  # built, not downloaded


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny-eval"))


def task(name: str, data_dir=FIXTURES) -> tasks.EvalTask:
    return tasks.load_task(name, TASK_DIR, data_dir)


def test_every_task_file_is_valid_and_names_what_to_download(tmp_path):
    """Each shipped task loads; with no data it fails with one line naming the download and the place."""
    for name in ALL_TASKS:
        t = task(name, tmp_path)
        with pytest.raises(CptkitError) as e:
            task_data.load_docs(t, t.spec["test_split"])
        msg = str(e.value)
        assert "\n" not in msg and f"eval task {t.name}: no data" in msg and str(tmp_path) in msg, msg
        assert "download" in msg or "git clone" in msg or "put " in msg, msg


# --- multiple choice ------------------------------------------------------------------------------
def test_mmlu_csv_first_n_shots_from_the_same_subject():
    t = task("mmlu")
    docs = task_data.load_docs(t, "test")
    assert [d["subject"] for d in docs] == ["abstract_algebra"] * 3 + ["anatomy"] * 3
    assert docs[0]["choices"] == ["one", "two", "three", "four"] and [d["answer"] for d in docs[:4]] == [3, 2, 1, 3]
    assert docs[0]["question"] == "abstract_algebra test question 0, with a comma"  # quoted CSV field
    ctx = fewshot.contexts(t, [docs[3]], 2, seed=1)[0]
    assert ctx == ("The following are multiple choice questions (with answers) about anatomy.\n\n"
                   "anatomy dev q0\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n"
                   "anatomy dev q1\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\n"
                   "anatomy test question 0, with a comma\nA. one\nB. two\nC. three\nD. four\nAnswer:")


def test_mmlu_stem_needs_its_nineteen_subjects():
    with pytest.raises(CptkitError, match=r"missing astronomy, college_biology.*download https://people.eecs"):
        task_data.load_docs(task("mmlu_stem"), "test")


def test_ceval_cmmlu_agieval_arc_mathqa_scieval_gold_indices():
    ce = task("ceval")
    d = task_data.load_docs(ce, "val")
    assert [templates.gold_index(ce, x, templates.doc_to_choice(ce, x)) for x in d] == [1, 2]
    assert fewshot.contexts(ce, d[:1], 1, 0)[0].startswith("以下是中国关于computer_network的单项选择题，请选出其中的正确答案。\n\n"
                                                           "计算机网络中 TCP 是哪一层协议？\nA. 传输层")
    cm = task("cmmlu")
    assert [templates.gold_index(cm, x, templates.doc_to_choice(cm, x)) for x in task_data.load_docs(cm, "test")] == [1]
    gk = task("gaokao_biology")
    g = task_data.load_docs(gk, "test")
    assert [x["label"] for x in g] == [0, 1] and g[1]["choices"] == ["黑暗", "光", "噪音", "塑料"]  # ["A"] and "B"
    assert templates.doc_to_choice(gk, g[0]) == ["(A)", "(B)", "(C)", "(D)"]
    assert templates.doc_to_text(gk, g[1]) == "问题：光合作用需要什么？ 选项：(A)黑暗 (B)光 (C)噪音 (D)塑料 \n答案：从A到D, 我们应选择"
    aq = task("aqua_rat")
    a = task_data.load_docs(aq, "test")[0]
    assert templates.doc_to_choice(aq, a) == ["(A)", "(B)", "(C)", "(D)", "(E)"] and a["choices"][0] == "30"
    arc = task("arc_easy")
    ad = task_data.load_docs(arc, "test")
    assert ad[1]["choices"] == {"text": ["meter", "kilogram", "second"], "label": ["1", "2", "3"]}
    assert [templates.gold_index(arc, x, templates.doc_to_choice(arc, x)) for x in ad] == [2, 1]  # answerKey "C" and "2"
    mq = task("mathqa")
    m = task_data.load_docs(mq, "test")
    assert m[0]["choices"] == ["38", "27.675", "30", "data inadequate", "none of these"] and m[0]["label"] == 1
    se = task("scieval")
    s = task_data.load_docs(se, "valid")
    assert [x["label"] for x in s] == [0, 1, 2] and s[0]["question"] == "What is the SI unit of force?"  # judge item dropped
    assert [x["category"] for x in task_data.load_docs(task("scieval_chemistry"), "valid")] == ["chemistry"]
    sq = task("sciq")
    assert templates.gold_index(sq, task_data.load_docs(sq, "test")[0], templates.doc_to_choice(sq, task_data.load_docs(sq, "test")[0])) == 3


# --- generative with answer extraction -----------------------------------------------------------------
def test_math_has_all_seven_subjects_and_a_missing_one_is_an_error(tmp_path):
    t = task("math")
    docs = task_data.load_docs(t, "test")
    assert sorted({d["subject"] for d in docs}) == sorted(F.MATH_SUBJECTS) and len(docs) == 14
    assert answers.extract(docs[0]["solution"], "boxed") == "3"
    shutil.copytree(FIXTURES / "MATH", tmp_path / "MATH")
    shutil.rmtree(tmp_path / "MATH" / "test" / "geometry")
    with pytest.raises(CptkitError) as e:
        task_data.load_docs(task("math", tmp_path), "test")
    msg = str(e.value)
    assert "MATH subject geometry" in msg and "all seven subjects" in msg and "MATH.tar" in msg and "\n" not in msg


def test_generative_golds_and_extractions():
    gs = task("gsm8k")
    d = task_data.load_docs(gs, "test")[0]
    assert answers.extract(d["answer"], "last_number") == "1234"  # "#### 1,234"
    assert answers.extract("so the total is 1,234 pens.", "last_number") == "1234"
    assert [x["answer"] for x in task_data.load_docs(task("asdiv"), "test")[:2]] == ["8", "9"]  # "8 (apples)"
    assert templates.answer_text(task("svamp"), task_data.load_docs(task("svamp"), "test")[0]) == "8"  # 8.0 shown as 8
    assert templates.answer_text(task("mawps"), task_data.load_docs(task("mawps"), "test")[0]) == "3"
    mv = task("minerva_math")
    shots = task_data.load_docs(mv, "fewshot")
    assert len(shots) == 4 and answers.extract(shots[0]["solution"], "minerva") == "[2,5)"
    assert answers.extract("so x = 4.\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "minerva") == "1/2"
    bbh = task("bbh")
    bd = task_data.load_docs(bbh, "test")
    ctx = fewshot.contexts(bbh, bd[:1], 3, 0)[0]
    assert ctx.startswith("Evaluate the result of a random Boolean expression.\n\nQ: not ( ( not not True ) ) is\n"
                          "A: Let's think step by step.")
    assert ctx.count("Q: ") == 4 and ctx.endswith("Q: not ( True ) and ( True ) is\nA:")
    method = bbh.spec["answer_extraction"]
    assert answers.extract(" Let's think step by step. not True = False. So the answer is False.", method) == "False"
    assert answers.extract("So the answer is (B).\n", method) == "(B)"


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
    he = task_data.load_docs(task("humaneval"), "test")
    assert [d["entry_point"] for d in he] == ["add", "is_even"]
    mb = task("mbpp")
    assert [d["task_id"] for d in task_data.load_docs(mb, "test")] == [11, 12]
    assert [d["task_id"] for d in task_data.load_docs(mb, "fewshot")] == [2, 3, 4]
    ctx = fewshot.contexts(mb, task_data.load_docs(mb, "test")[:1], 3, 0)[0]
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

    from cptkit.eval import task_data

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    task_data.hub_reachable.cache_clear()
    model_dir, _, _ = tiny
    try:
        res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "o"),
                                       f"eval.data_dir={tmp_path}", "eval.tasks=[mmlu]"])
    finally:
        task_data.hub_reachable.cache_clear()
    assert isinstance(res.exception, CptkitError) and res.exception.exit_code == 2
    msg = str(res.exception)
    assert "unreachable" in msg and "cais/mmlu" in msg and "\n" not in msg and not (tmp_path / "o").exists()


# --- Gauntlet v0.3 (upsampling suite): one reader each, gold / target of a known item ---------------------
def test_jsonl_labels_reads_piqa_and_siqa_answers_from_their_lst_files():
    pq = task("piqa")
    docs = task_data.load_docs(pq, "test")
    assert [d["label"] for d in docs] == [0, 1]  # valid-labels.lst
    assert templates.doc_to_text(pq, docs[1]) == "Question: To dry wet shoes quickly,\nAnswer:"
    assert templates.doc_to_choice(pq, docs[1])[templates.gold_index(pq, docs[1], templates.doc_to_choice(pq, docs[1]))] == "stuff them with newspaper."
    sq = task("siqa")
    s = task_data.load_docs(sq, "test")
    assert [templates.gold_index(sq, d, templates.doc_to_choice(sq, d)) for d in s] == [1, 0, 2]  # labels 2 1 3 -> index - 1
    assert templates.doc_to_choice(sq, s[2]) == ["to fail", "to sleep", "to do well"]


def test_bigbench_json_choices_targets_prefixes_and_subtasks():
    sq = task("bigbench_strategyqa")
    d = task_data.load_docs(sq, "test")
    assert d[0]["multiple_choice_targets"] == ["Yes", "No"] and templates.gold_index(sq, d[0], templates.doc_to_choice(sq, d[0])) == 1
    assert templates.doc_to_text(sq, d[0]) == "Q: Could a goldfish read a newspaper?\nA:"  # BIG-bench's default prefixes
    ss = task("bigbench_strange_stories")
    st = task_data.load_docs(ss, "test")
    assert {x["subtask"] for x in st} == {"boolean"} and len(st) == 3  # the 4-choice subtask left out
    assert templates.doc_to_text(ss, st[2]).endswith("Is Leo being polite?\nAnswer:") and st[2]["label"] == 0
    wd = task("bigbench_qa_wikidata")
    w = task_data.load_docs(wd, "test")
    assert w[0]["targets"] == ["Oslo", "Oslo, Norway"] and w[1]["targets"] == ["French"]
    assert templates.doc_to_text(wd, w[0]) == "The capital of Norway is" and templates.answer_text(wd, w[0]) == "Oslo"
    op = task("bigbench_operators")
    ctx = fewshot.contexts(op, task_data.load_docs(op, "test")[:1], 1, 0)[0]
    assert ctx.startswith("Given the definition of the op operator, compute the result.\n\nQ: ")  # task_prefix once
    assert templates.answer_text(task("bigbench_dyck_languages"), task_data.load_docs(task("bigbench_dyck_languages"), "test")[0]) == ") ]"
    both = F.bigbench_json(FIXTURES / "BIG-bench/bigbench/benchmark_tasks/strange_stories", "test", {})
    assert [x["subtask"] for x in both] == ["boolean"] * 3 + ["multiple_choice"] and both[3]["label"] == 0
    with pytest.raises(F.MissingData, match="missing hard"):
        F.bigbench_json(FIXTURES / "BIG-bench/bigbench/benchmark_tasks/strange_stories", "test", {"subtasks": ["hard"]})


def test_wsc_xml_partial_scoring_contexts_and_continuation():
    wg = task("winograd")
    docs = task_data.load_docs(wg, "test")
    assert [d["label"] for d in docs] == [1, 0, 1, 1]  # "B", " A. ", "B", "B"
    d = docs[1]
    assert d["text"] == "The vase would not stand on the narrow shelf because it was too wide."  # whitespace collapsed
    assert templates.doc_to_choice(wg, d) == ["The vase would not stand on the narrow shelf because the vase",
                                              "The vase would not stand on the narrow shelf because the shelf"]
    assert templates.answer_text(wg, d) == "was too wide." and templates.doc_to_text(wg, d).endswith("because the vase")
    assert docs[3]["partial_options"] == ["Peter's", "Hans's"]  # possessive pronoun "his"
    assert len(F.wsc_xml(FIXTURES / "winograd/WSCollection.xml", "test", {"first": 2})) == 2


def test_squad_coqa_triviaqa_jeopardy_json_targets():
    sq = task("squad")
    s = task_data.load_docs(sq, "test")
    assert [x["id"] for x in s] == ["dv1", "dv2", "dv3"] and s[1]["answers"]["text"] == ["8", "atomic number 8"]
    assert s[1]["answers"]["answer_start"] == [61, 47] and templates.answer_text(sq, s[2]) == "the Mediterranean Sea"
    cq = task("coqa")
    c = task_data.load_docs(cq, "test")
    assert [x["id"] for x in c] == ["s1/1", "s1/2", "s1/3", "s2/1", "s2/2"]
    assert c[1]["answers"] == ["a miller", "Otto"] and c[0]["answers"] == ["grey"]  # "Grey" is a duplicate
    assert templates.doc_to_text(cq, c[2]).endswith("goats, who ate the grass around the mill.\n\nQ: What color was the mill?\n\n"
                                             "A: grey\n\nQ: Who lived there?\n\nA: a miller\n\nQ: Did he live alone?\n\nA:")
    assert templates.answer_text(cq, c[2]) == "no"
    tq = task("triviaqa_sub")
    t = task_data.load_docs(tq, "test")
    assert templates.gold_texts(tq, t[1]) == ["The Beatles", "Beatles"] and templates.answer_text(tq, t[1]) == "The Beatles"
    assert answers.extract(" the Beatles!", "squad") == answers.extract("The Beatles", "squad") == "beatles"
    jp = task("jeopardy")
    j = task_data.load_docs(jp, "test")
    assert templates.doc_to_text(jp, j[2]) == 'WORD ORIGINS: From the Latin for "to breathe", it\'s this organ\nAnswer:'  # quotes, tags
    assert templates.answer_text(jp, j[2]) == "the lung"
    whole = F.read("json", FIXTURES / "jeopardy/JEOPARDY_QUESTIONS1.json", "test")
    some = F.read("json", FIXTURES / "jeopardy/JEOPARDY_QUESTIONS1.json", "test", {"sample": 2, "sample_seed": 3})
    assert some == [whole[i] for i in sorted(random.Random(3).sample(range(4), 2))]  # a seeded subset, file order


def test_superglue_hellaswag_winogrande_lambada_obqa_csqa_prompts():
    cp = task("copa")
    c = task_data.load_docs(cp, "test")[1]
    assert templates.doc_to_text(cp, c) == "The child dropped her ice cream therefore"
    assert templates.doc_to_choice(cp, c) == ["she laughed at a joke.", "she started to cry."] and templates.gold_index(cp, c, templates.doc_to_choice(cp, c)) == 1
    bq = task("boolq")
    b = task_data.load_docs(bq, "test")
    assert [templates.gold_index(bq, x, ["no", "yes"]) for x in b] == [1, 0]  # JSON true / false
    hs = task("hellaswag")
    h = task_data.load_docs(hs, "test")[2]  # lm-eval's preprocess: " [title]" -> ". ", [..] dropped, double spaces collapsed
    assert templates.doc_to_text(hs, h) == "Home and Garden: How to water a plant. Fill a can."
    assert templates.doc_to_choice(hs, h)[0] == " Pour the water. slowly onto the soil." and templates.gold_index(hs, h, templates.doc_to_choice(hs, h)) == 0
    wg = task("winogrande")
    w = task_data.load_docs(wg, "test")
    assert [templates.gold_index(wg, x, templates.doc_to_choice(wg, x)) for x in w] == [0, 1]
    assert templates.doc_to_choice(wg, w[1]) == ["Emma always beat Lucy at chess, so Emma", "Emma always beat Lucy at chess, so Lucy"]
    assert templates.answer_text(wg, w[1]) == "practised more every evening."
    shot = fewshot.contexts(wg, w[:1], 1, 0)[0]  # a shot shows the correct option, then the rest of its sentence
    assert shot.split("\n\n")[0] in ("Mark lent his ladder to Tom because Tom needed to clean the gutters.",
                                      "The book would not fit on the shelf because the book was too tall.")
    lb = task("lambada_openai")
    lam = task_data.load_docs(lb, "test")[1]
    assert templates.doc_to_text(lb, lam).endswith("by noon the tired dog") and templates.answer_text(lb, lam) == "slept"
    ob = task("openbookqa")
    o = task_data.load_docs(ob, "test")[0]
    assert templates.doc_to_text(ob, o) == "Which of these conducts heat best?" and templates.gold_index(ob, o, templates.doc_to_choice(ob, o)) == 1
    cs = task("commonsense_qa")
    q = task_data.load_docs(cs, "test")[0]
    assert templates.gold_index(cs, q, templates.doc_to_choice(cs, q)) == 2 and templates.doc_to_text(cs, q).endswith("E. library\nAnswer:")
    ar = task("arc_challenge")
    assert [templates.gold_index(ar, x, templates.doc_to_choice(ar, x)) for x in task_data.load_docs(ar, "test")] == [1, 2]


def test_simple_arithmetic_is_built_from_a_seed_and_answered_with_precedence(tmp_path):
    from cptkit.eval.build_tasks import arithmetic_value, build

    build("simple_arithmetic", tmp_path / "a")
    build("simple_arithmetic", tmp_path / "b")
    a = (tmp_path / "a/simple_arithmetic/test.jsonl").read_bytes()
    assert a == (tmp_path / "b/simple_arithmetic/test.jsonl").read_bytes()  # deterministic
    rows = [json.loads(x) for x in a.decode().splitlines()]
    assert len(rows) == 1000 and {len(r["tokens"]) for r in rows} == {3, 5, 7}  # 1-3 operations
    assert all(len(t) <= 3 for r in rows for t in r["tokens"][::2])  # numbers of up to 3 digits
    assert arithmetic_value(["2", "+", "3", "*", "4", "-", "5"]) == 9 and arithmetic_value(["7", "-", "2", "-", "1"]) == 4
    assert all(str(arithmetic_value(r["tokens"])) == r["answer"] for r in rows)
    ws, ns = task("simple_arithmetic_withspaces", tmp_path / "a"), task("simple_arithmetic_nospaces", tmp_path / "a")
    d = task_data.load_docs(ws, "test")[1]  # built on first use when missing: here already built
    assert templates.doc_to_text(ws, d) == " ".join(d["tokens"]) + " =" and templates.doc_to_text(ns, d) == "".join(d["tokens"]) + "="
    assert fewshot.contexts(ns, [d], 1, 0)[0].split("\n\n")[0].count("=") == 1  # the shot: "a+b=c", no space


def test_missing_gauntlet_file_is_one_line_naming_the_download(tmp_path):
    (tmp_path / "piqa").mkdir()
    shutil.copy(FIXTURES / "piqa/valid.jsonl", tmp_path / "piqa/valid.jsonl")  # the labels file is missing
    with pytest.raises(CptkitError) as e:
        task_data.load_docs(task("piqa", tmp_path), "test")
    msg = str(e.value)
    assert "\n" not in msg and "valid-labels.lst not found" in msg and "https://yonatanbisk.com/piqa/data/" in msg
    with pytest.raises(CptkitError) as e:
        task_data.load_docs(task("bigbench_dyck_languages", tmp_path), "test")
    msg = str(e.value)
    assert "\n" not in msg and "git clone https://github.com/google/BIG-bench" in msg and str(tmp_path) in msg
    (tmp_path / "piqa/valid-labels.lst").write_text("0\n")  # one label for two items
    with pytest.raises(BadInput, match=r"valid-labels.lst: expected one integer label per item"):
        task_data.load_docs(task("piqa", tmp_path), "test")


def test_loglikelihood_and_partial_scoring_requests(monkeypatch):
    """What is sent to the model: loglikelihood continuations, Winogrande's per-choice contexts."""
    from cptkit.models import scoring

    sent: list[list[tuple[str, str]]] = []

    def fake_ll(model, tok, reqs, batch_size=8, max_length=None):
        sent.append(list(reqs))
        return [(-float(len(c)), c.strip() in ("door", "was chosen for the school team.")) for _, c in reqs]

    monkeypatch.setattr(scoring, "loglikelihood", fake_ll)
    m, items = runner.run_task(None, None, task("lambada_openai"), num_fewshot=0)
    assert sent[0][0] == ("She handed him the key and said the door was stuck, so he would have to push hard on the",
                          " door") and m["acc"] == 0.5 and items[0]["acc"] == 1.0 and "acc_norm" not in m
    m, items = runner.run_task(None, None, task("winogrande"), num_fewshot=0)
    assert sent[1][:2] == [("Emma always beat Lucy at chess, so Emma", " was chosen for the school team."),
                           ("Emma always beat Lucy at chess, so Lucy", " was chosen for the school team.")]
    assert [it["gold"] for it in items] == [0, 1] and m["n"] == 2


def test_generative_targets_as_a_list_match_any(monkeypatch):
    from cptkit.models import scoring

    monkeypatch.setattr(scoring, "generate_until", lambda model, tok, ctxs, **kw: [" city of light", " the beatles", " eight"][:len(ctxs)])
    m, items = runner.run_task(None, None, task("triviaqa_sub"), num_fewshot=0)
    assert [it["exact_match"] for it in items] == [1.0, 1.0, 1.0] and items[1]["gold"] == ["beatles", "beatles"]
