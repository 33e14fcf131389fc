"""evaluate: perplexity per group, lm-eval-compatible scoring, contamination, compare (SPEC §10).

Real parts only: a byte-level BPE tokenizer trained on real text (Debian copyright files) and a
tiny random Llama saved to disk, the real dict-gcide and champ-dataset tasks, and (slow) the real
lm-evaluation-harness on the same model and task.
"""

from __future__ import annotations

import glob
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from outputs import read_jsonl_dir
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.eval import answers, fewshot, runner, task_data, tasks
from cptkit.eval.contamination import BenchmarkIndex, ngram_hashes, words
from cptkit.models import lm, scoring
from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer

EVAL_CACHE = Path(os.environ.get("CPTKIT_TEST_CACHE", os.path.expanduser("~/.cache/cptkit/test-corpus"))) / "eval-data"


def _texts(n: int = 240) -> list[str]:
    files = sorted(glob.glob("/usr/share/doc/*/copyright"))
    out = []
    for f in files:
        t = Path(f).read_text(errors="replace").strip()
        if len(t) > 400:
            out.append(t[:3000])
        if len(out) == n:
            break
    assert len(out) >= 60, "needs Debian copyright files under /usr/share/doc"
    return out


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return _texts()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, texts):
    """(model dir, tokenizer, model): BPE on real text + a seeded tiny Llama, saved like a checkpoint."""
    d = tmp_path_factory.mktemp("tiny-llama")
    tok = train_bpe_tokenizer(texts, vocab_size=700)
    model = tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=1024, seed=11)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, tok, model


@pytest.fixture(scope="session")
def eval_data() -> Path:
    """The real tasks' data (dict-gcide, champ-dataset), built once into the test cache."""
    from cptkit.eval.build_tasks import build

    for name in ("gcide_defs", "champ_math"):
        if not (EVAL_CACHE / name / "about.json").exists():
            build(name, EVAL_CACHE)
    return EVAL_CACHE


@pytest.fixture(scope="session")
def heldout(tmp_path_factory, texts) -> Path:
    d = tmp_path_factory.mktemp("heldout")
    with open(d / "part-00000.jsonl", "w") as f:
        for i, t in enumerate(texts[:90]):
            lic = "gpl" if "GPL" in t else "other"
            f.write(json.dumps({"id": f"doc{i}", "text": t, "license": lic}) + "\n")
    return d


# --- cptkit.models.scoring ---------------------------------------------------------------------------------
def test_tiny_llama_is_seeded(tiny):
    _, tok, model = tiny
    again = tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=1024, seed=11)
    other = tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=1024, seed=12)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))
    assert model.config.vocab_size == len(tok) and tok.encode("The GNU", add_special_tokens=False)


def test_document_losses_match_a_direct_computation(tiny, texts):
    _, tok, model = tiny
    docs = texts[:5]
    batched = scoring.document_losses(model, tok, docs, batch_size=3, max_length=10_000)
    for (s, n), text in zip(batched, docs, strict=True):
        ids = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]])).logits[0].float()
        ref = F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item()
        assert n == len(ids) - 1
        assert s == pytest.approx(ref, rel=1e-4)
    # windows: every token scored exactly once whatever the window length
    windowed = scoring.document_losses(model, tok, docs, batch_size=4, max_length=64)
    assert [n for _, n in windowed] == [n for _, n in batched]
    assert scoring.document_losses(model, tok, [""], max_length=64) == [(0.0, 0)]


def test_group_losses_are_token_weighted_with_a_doc_cap(tiny, texts):
    _, tok, model = tiny
    recs = [{"id": f"r{i}", "text": t, "g": "a" if i % 3 else "b"} for i, t in enumerate(texts[:12])]
    out = scoring.group_losses(model, tok, recs, "g", max_docs_per_group=3, batch_size=4, max_length=256)
    assert list(out) == ["a", "b"] and out["a"]["docs"] == 3 and out["b"]["docs"] == 3
    first_a = [r["text"] for r in recs if r["g"] == "a"][:3]
    per_doc = scoring.document_losses(model, tok, first_a, max_length=256)
    assert out["a"]["tokens"] == sum(n for _, n in per_doc)
    assert out["a"]["loss"] == pytest.approx(sum(s for s, _ in per_doc) / sum(n for _, n in per_doc), rel=1e-6)
    assert out["a"]["ppl"] == pytest.approx(math.exp(out["a"]["loss"]))
    with pytest.raises(Exception, match="record r0: no field 'topic'"):
        scoring.group_losses(model, tok, recs, "topic")


def test_encode_pair_moves_trailing_space_and_splits_the_whole_encoding(tiny):
    _, tok, _ = tiny
    ctx, cont = scoring.encode_pair(tok, "Copyright: ", "GPL")
    assert ctx == tok.encode("Copyright:") and ctx + cont == tok.encode("Copyright: GPL")
    ctx0, cont0 = scoring.encode_pair(tok, "", "license")
    assert ctx0 == [tok.bos_token_id] and cont0 == tok.encode("license", add_special_tokens=False)


def test_loglikelihood_is_the_sum_of_token_logprobs(tiny):
    _, tok, model = tiny
    reqs = [("Permission is hereby granted", " free of charge"), ("The", " software"), ("", "License")]
    got = scoring.loglikelihood(model, tok, reqs, batch_size=2)
    for (c, x), (ll, _) in zip(reqs, got, strict=True):
        ctx, cont = scoring.encode_pair(tok, c, x)
        seq = ctx + cont
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([seq[:-1]])).logits[0].float(), -1)
        ref = sum(logp[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont))
        assert ll == pytest.approx(ref, abs=1e-4)


# --- task pieces ----------------------------------------------------------------------------------
def test_mc_predictions_acc_vs_acc_norm():
    # summed LL prefers the short choice; per character the long one wins (lm-eval's acc_norm)
    assert answers.mc_predictions([-10.0, -12.0], ["ab", "abcdefgh"]) == (0, 1)
    assert answers.mc_predictions([-3.0, -3.0, -1.0], ["x", "y", "zz"]) == (2, 2)
    assert answers.mc_predictions([-2.0, -2.0], ["aa", "bb"]) == (0, 0)  # ties: first, like numpy.argmax


def test_answer_extraction():
    assert answers.last_number("She pays 3 + 4 = 7 dollars, so #### 1,234.") == "1234"
    assert answers.last_number("no digits") is None
    assert answers.extract(r"so $\boxed{\frac{1}{2}}$ and \boxed{\dfrac{3}{4}}.", "boxed") == "3/4"
    assert answers.last_boxed(r"\boxed{x^{2}+1}") == "x^{2}+1"
    assert answers.answers_match("72.0", "72") and answers.answers_match("0.5", "1/2") and not answers.answers_match("7", "72")
    assert answers.extract("The answer is 42.", "regex:answer is (\\d+)") == "42"


def test_fewshot_context_layout(eval_data):
    task = tasks.load_task("gcide_defs", Path(__file__).parent.parent / "conf/eval/tasks", eval_data)
    docs = task_data.load_docs(task, "test")[:2]
    ctx = fewshot.contexts(task, docs, 2, seed=1234)
    shots = task_data.load_docs(task, "validation")
    import random

    rnd = random.Random(1234)
    first = rnd.sample(shots, 2)
    expect = "".join(f"Word: {s['word']} ({s['pos']})\nDefinition: {s['choices'][s['label']]}\n\n" for s in first)
    assert ctx[0] == expect + f"Word: {docs[0]['word']} ({docs[0]['pos']})\nDefinition:"
    assert ctx[1].endswith(f"Word: {docs[1]['word']} ({docs[1]['pos']})\nDefinition:") and ctx[1] != ctx[0]


def test_gcide_task_is_real_and_deterministic(eval_data, tmp_path):
    from cptkit.eval.build_tasks import build

    rows = [json.loads(x) for x in (eval_data / "gcide_defs" / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 500 and all(len(r["choices"]) == 4 and 0 <= r["label"] < 4 for r in rows)
    assert len({r["word"] for r in rows}) == 500
    labels = [r["label"] for r in rows]
    assert all(70 < labels.count(k) < 180 for k in range(4))  # answer position is not a giveaway
    build("champ_math", tmp_path)
    assert (tmp_path / "champ_math/test.jsonl").read_bytes() == (eval_data / "champ_math/test.jsonl").read_bytes()
    champ = [json.loads(x) for x in (eval_data / "champ_math" / "test.jsonl").read_text().splitlines()]
    assert len(champ) >= 60 and all(r["solution"].endswith(f"The answer is {r['answer']}.") for r in champ)


# --- contamination ----------------------------------------------------------------------------------
def test_ngram_index_finds_planted_overlaps():
    items = ["What is the boiling point of water at sea level in degrees Celsius today",
             "Name the largest planet of the solar system and its most famous moon please"]
    ix = BenchmarkIndex.build("t", items, 8)
    clean = "The cat sat on the mat and looked out of the window for a long time."
    planted = "Notes: the BOILING point of water at sea level, in degrees -- Celsius today! fin"
    assert ix.match(ngram_hashes(clean, 8)) == set()
    assert ix.match(ngram_hashes(planted, 8)) == {0}
    assert ix.match(ngram_hashes("boiling point of water at sea level", 8)) == set()  # 7 words only
    assert words("Hello, World_1 ok") == ["hello", "world_1", "ok"]
    assert ix.n_items == 2 and ix.n_checkable == 2


def test_contamination_step_reports_flags_and_drops(eval_data, tmp_path):
    rows = [json.loads(x) for x in (eval_data / "gcide_defs" / "test.jsonl").read_text().splitlines()]
    r0, r1 = rows[0], rows[1]
    item0 = f"{r0['word']}: {r0['choices'][r0['label']]}"  # the task's doc_to_decontamination_query
    docs = [{"id": "clean1", "text": "A plain paragraph about shipping containers and harbours."},
            {"id": "hit0", "text": "Quiz dump -- " + item0 + " -- end"},
            {"id": "clean2", "text": f"The word {r1['word']} appears here alone."},
            {"id": "hit0b", "text": item0.upper()}]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = ["eval.tasks=[gcide_defs]", f"eval.data_dir={eval_data}", "eval.ngram=8", "-q"]
    res = CliRunner().invoke(app, ["evaluate-contamination", "--in", str(src), "--out", str(tmp_path / "c"),
                                   "eval.action=flag", *common])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "c" / "_contamination.json").read_text())["benchmarks"]["gcide_defs"]
    assert rep["docs_contaminated"] == 2 and rep["docs_share"] == 0.5
    assert rep["test_items_hit"] == 1 and rep["test_items_share"] == 1 / 500
    flagged = {r["id"]: r["contaminated"] for r in read_jsonl_dir(tmp_path / "c")}
    assert flagged == {"clean1": [], "hit0": ["gcide_defs"], "clean2": [], "hit0b": ["gcide_defs"]}
    res = CliRunner().invoke(app, ["evaluate-contamination", "--in", str(src), "--out", str(tmp_path / "d"),
                                   "eval.action=drop", *common])
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in read_jsonl_dir(tmp_path / "d")] == ["clean1", "clean2"]


def test_cjk_ngrams_count_characters():
    # "机器学习 is fun，很好" → 机 器 学 习 is fun 很 好: 8 words, so 8 − 3 + 1 = 6 trigrams and one 8-gram
    assert words("机器学习 is fun，很好") == ["机", "器", "学", "习", "is", "fun", "很", "好"]
    assert len(ngram_hashes("机器学习 is fun，很好", 3)) == 6 and len(ngram_hashes("机器学习 is fun，很好", 8)) == 1
    # kana are CJK too; Latin words inside stay whole: 日 本 語 の python テ ス ト = 8 words
    assert words("日本語のpythonテスト") == ["日", "本", "語", "の", "python", "テ", "ス", "ト"]
    # a 7-character question has no 8-gram; before, the whole run was ONE word and no item had any
    assert len(ngram_hashes("下列说法正确的", 8)) == 0 and len(ngram_hashes("下列说法正确的是", 8)) == 1


CEVAL_ROWS = [  # C-Eval's val CSV: id,question,A,B,C,D,answer,explanation
    ["0", "新民主主义革命的对象是帝国主义、封建主义和官僚资本主义", "正确", "错误", "部分正确", "无法判断", "A", ""],
    ["1", "下列关于光合作用的叙述，正确的是", "只在白天进行", "需要叶绿体", "不需要光", "只释放二氧化碳", "B", ""],
    ["2", "我国古代四大发明不包括下列哪一项", "造纸术", "印刷术", "火药", "地动仪", "D", ""],
]


def test_contamination_step_finds_planted_ceval_items(tmp_path):
    import csv

    data = tmp_path / "data"
    for split in ("val", "dev"):
        (data / "ceval" / split).mkdir(parents=True)
        with open(data / "ceval" / split / f"high_school_history_{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "question", "A", "B", "C", "D", "answer", "explanation"])
            w.writerows(CEVAL_ROWS)
    q1 = CEVAL_ROWS[1][1]
    docs = [{"id": "clean", "text": "光合作用是植物利用光能把二氧化碳和水合成有机物的过程。"},  # shares topic words only
            {"id": "hit1", "text": f"高考复习资料：{q1}？A. 只在白天进行 B. 需要叶绿体 答案B。"},
            {"id": "hit2", "text": "题目：我国古代四大发明不包括下列哪一项（　）"},
            {"id": "short", "text": "四大发明不包括"}]  # 7 characters: below the 8-gram
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    res = CliRunner().invoke(app, ["evaluate-contamination", "--in", str(src), "--out", str(tmp_path / "c"),
                                   "eval.action=flag", "eval.tasks=[ceval]", f"eval.data_dir={data}",
                                   "eval.ngram=8", "-q"])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "c" / "_contamination.json").read_text())["benchmarks"]["ceval"]
    assert rep["docs_contaminated"] == 2 and rep["test_items_hit"] == 2
    flagged = {r["id"]: r["contaminated"] for r in read_jsonl_dir(tmp_path / "c")}
    assert flagged == {"clean": [], "hit1": ["ceval"], "hit2": ["ceval"], "short": []}


# --- the step -----------------------------------------------------------------------------------------
def test_evaluate_ppl_and_tasks_end_to_end(tiny, heldout, eval_data, tmp_path):
    model_dir, tok, model = tiny
    out = tmp_path / "ev"
    res = CliRunner().invoke(app, [
        "evaluate", "--model", str(model_dir), "--in", str(heldout), "--out", str(out), "-q",
        "eval.ppl.group_by=license", "eval.ppl.max_docs_per_group=20", "eval.ppl.max_length=256",
        "eval.tasks=[gcide_defs,champ_math]", "eval.limit=6", "eval.shots=2", f"eval.data_dir={eval_data}",
        "eval.max_gen_toks=6", "eval.batch_size=4"])
    assert res.exit_code == 0, res.output
    r = json.loads((out / "_results.json").read_text())
    groups = r["perplexity"]["groups"]
    assert set(groups) == {"gpl", "other"} and all(g["docs"] == 20 for g in groups.values())
    # the very numbers of cptkit.models.scoring.group_losses (the train controllers' code path)
    recs = [json.loads(x) for x in (heldout / "part-00000.jsonl").read_text().splitlines()]
    ref = scoring.group_losses(model, tok, recs, "license", 20, batch_size=4, max_length=256)
    assert groups["gpl"]["loss"] == pytest.approx(ref["gpl"]["loss"], rel=1e-5)
    assert r["perplexity"]["all"]["tokens"] == ref["gpl"]["tokens"] + ref["other"]["tokens"]
    g = r["tasks"]["gcide_defs"]
    assert g["metrics"]["n"] == 6 and g["metrics"]["num_fewshot"] == 2 and len(g["hash"]) == 16
    assert 0 <= g["metrics"]["acc"] <= 1 and r["tasks"]["champ_math"]["metrics"]["exact_match"] == 0.0
    assert r["model"]["class"] == "LlamaForCausalLM" and r["model"]["parameters"] == model.num_parameters()
    items = read_jsonl_dir(out)
    assert len(items) == 12 and sum(it["acc"] for it in items if it["task"] == "gcide_defs") == 6 * g["metrics"]["acc"]
    # compare: two runs side by side with deltas
    r2 = dict(r)
    r2["tasks"] = json.loads(json.dumps(r["tasks"]))
    r2["tasks"]["gcide_defs"]["metrics"]["acc_norm"] += 0.5
    (tmp_path / "b.json").write_text(json.dumps(r2))
    cmp = CliRunner().invoke(app, ["evaluate-compare", f"base={out}", f"cpt={tmp_path / 'b.json'}",
                                   "--out", str(tmp_path / "cmp.json")])
    assert cmp.exit_code == 0, cmp.output
    table = json.loads((tmp_path / "cmp.json").read_text())
    assert table["header"][:3] == ["run", "gcide_defs", "champ_math"]
    assert table["rows"][2][1] == pytest.approx(50.0) and table["rows"][2][2] == 0.0


def test_bad_task_file_is_one_line_error_and_nothing_written(tiny, tmp_path):
    model_dir, _, _ = tiny
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: bad\noutput_type: multiple_choice\ndoc_to_txt: oops\n")
    res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "o"),
                                   f"eval.tasks=[{bad}]"])
    assert res.exit_code != 0 and "bad.yaml: unknown task keys: doc_to_txt" in str(res.exception)
    assert not (tmp_path / "o").exists()
    res = CliRunner().invoke(app, ["evaluate", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o"),
                                   "eval.tasks=[gcide_defs]"])
    assert res.exit_code != 0 and not (tmp_path / "o").exists()


# --- agreement with lm-evaluation-harness ------------------------------------------------------------------
LM_EVAL_YAML = """task: cptkit_gcide_agree
dataset_path: json
dataset_kwargs:
  data_files:
    test: {test}
    validation: {val}
output_type: multiple_choice
test_split: test
fewshot_split: validation
doc_to_text: "Word: {{{{word}}}} ({{{{pos}}}})\\nDefinition:"
doc_to_choice: choices
doc_to_target: label
num_fewshot: 3
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.mark.slow
def test_acc_and_acc_norm_identical_to_lm_eval(tiny, eval_data, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    model_dir, tok, model = tiny
    n = 40
    test = tmp_path / "test.jsonl"
    test.write_text("".join((eval_data / "gcide_defs/test.jsonl").read_text().splitlines(True)[:n]))
    val = eval_data / "gcide_defs/validation.jsonl"
    (tmp_path / "lm_eval_task.yaml").write_text(LM_EVAL_YAML.format(test=test, val=val))
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32", device="cpu",
                                  tasks=["cptkit_gcide_agree"], batch_size=8, log_samples=True,
                                  task_manager=TaskManager(include_path=str(tmp_path)), fewshot_random_seed=1234)
    ref = out["results"]["cptkit_gcide_agree"]
    # the same task as a cptkit task file (cptkit's format is a subset of lm-eval's)
    (tmp_path / "cptkit_task.yaml").write_text(
        "task: agree\noutput_type: multiple_choice\n"
        f"data_files: {{test: {test}, validation: {val}}}\n"
        "test_split: test\nfewshot_split: validation\nnum_fewshot: 3\n"
        'doc_to_text: "Word: {{word}} ({{pos}})\\nDefinition:"\ndoc_to_choice: choices\ndoc_to_target: label\n')
    task = tasks.load_task(str(tmp_path / "cptkit_task.yaml"), tmp_path, tmp_path)
    loaded = lm.load_causal_lm(str(model_dir))
    metrics, items = runner.run_task(loaded, lm.load_tokenizer(str(model_dir)), task, seed=1234, batch_size=8)
    assert metrics["n"] == n
    assert metrics["acc"] == ref["acc,none"] and metrics["acc_norm"] == ref["acc_norm,none"]
    samples = sorted(out["samples"]["cptkit_gcide_agree"], key=lambda s: s["doc_id"])
    for it, s in zip(items, samples, strict=True):
        theirs = [float(r[0][0]) for r in s["resps"]]
        assert it["lls"] == pytest.approx(theirs, abs=1e-4)
        assert it["acc"] == s["acc"] and it["acc_norm"] == s["acc_norm"]
    # and the few-shot prompts are the same strings
    ctxs = fewshot.contexts(task, task_data.load_docs(task, "test"), 3, 1234)
    assert [s["arguments"][0][0] for s in samples] == ctxs
