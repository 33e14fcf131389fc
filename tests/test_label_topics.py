"""label-topics(-train, -annotate): taxonomies, answer mapping, per-language classifiers on real text."""

from __future__ import annotations

import json
import math

import pytest
from classify_realtext import fortunes_en, manpages_zh, maxima_docs, poems_zh, python_docs
from conftest import read_jsonl_dir as read_out
from conftest import write_jsonl
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.config import CONF_DIR, compose_step
from cptkit.core.errors import CptkitError
from cptkit.labels.topics import (
    build_prompt,
    load_taxonomy,
    map_answer,
    pick_topic,
    truncate_tokens,
)
from cptkit.steps import label_topics, label_topics_annotate
from cptkit.text.langid import detect

runner = CliRunner()
EN = load_taxonomy(CONF_DIR / "topics" / "en.yaml")
ZH = load_taxonomy(CONF_DIR / "topics" / "zh.yaml")


def test_taxonomies_from_the_paper():
    assert len(EN.topics) == 11 and EN.topics[0] == "Mathematics and Physics" and EN.topics[-1] == "Others"
    # App. I: n = 11 for Chinese; Table 5's "Philosophy Arts and Culture" is one topic, as is
    # "Psychology Sociology and Education"
    assert len(ZH.topics) == 11 and "Project and Practical Management" in ZH.topics
    assert "Philosophy, Arts and Culture" in ZH.topics and "Psychology, Sociology and Education" in ZH.topics
    assert not {"Philosophy", "Psychology", "Arts and Culture"} & set(ZH.topics)
    p = build_prompt(EN, "Page text " * 500, max_chars=100)
    assert "Security and International Relations\nMedicine and Health" in p and len(p) < 1000
    assert p.rstrip().endswith("Please only return the most related topic:")


@pytest.mark.parametrize("answer,topic", [
    ("Computer Science and Engineering", "Computer Science and Engineering"),
    ("  **computer science and engineering**.", "Computer Science and Engineering"),
    ("Topic: Mathematics and Physics\nBecause ...", "Mathematics and Physics"),
    ("1. Medicine and Health", "Medicine and Health"),
    ("The article is about Law and Policy.", "Law and Policy"),
    ("Physics", "Mathematics and Physics"),
    ("Economics & Business", "Economics and Business"),  # close spelling
    ("Mathematics and Physics, Biology and Chemistry", None),  # two topics: rejected
    ("I cannot determine the topic.", None),
    ("", None),
])
def test_map_answer_en(answer, topic):
    assert map_answer(answer, EN) == topic


def test_map_answer_zh():
    assert map_answer("艺术与文化", ZH) == "Philosophy, Arts and Culture"
    assert map_answer("主题：计算机", ZH) == "Computer Science and Engineering"
    assert map_answer("Philosophy", ZH) == "Philosophy, Arts and Culture"
    assert map_answer("心理学", ZH) == "Psychology, Sociology and Education"
    assert map_answer("Psychology, Sociology and Education", ZH) == "Psychology, Sociology and Education"
    assert map_answer("天气", ZH) is None


def test_bad_taxonomy(tmp_path):
    (tmp_path / "t.yaml").write_text("topics: [A, B]\naliases: {x: C}\n")
    with pytest.raises(CptkitError, match="alias target 'C'"):
        load_taxonomy(tmp_path / "t.yaml")


def test_language_id():
    got = detect(["The function returns a list of strings.", "床前明月光，疑是地上霜。", ""])
    assert [g[0] for g in got] == ["en", "zh", "und"]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    d = tmp_path_factory.mktemp("topics")
    recs = ([{**r, "topic": "Computer Science and Engineering"} for r in python_docs(150)]
            + [{**r, "topic": "Mathematics and Physics"} for r in maxima_docs(150)]
            + [{**r, "topic": "Others"} for r in fortunes_en(150)]
            + [{**r, "topic": "Computer Science and Engineering"} for r in manpages_zh(150)]
            + [{**r, "topic": "Philosophy, Arts and Culture"} for r in poems_zh(150)])
    write_jsonl(d / "labels" / "a.jsonl", recs[::2])  # no lang field: detected
    write_jsonl(d / "labels" / "b.jsonl", recs[1::2])
    model = d / "models"
    r = runner.invoke(app, ["label-topics-train", "--in", str(d / "labels"), "--out", str(model), "-q"])
    assert r.exit_code == 0, r.output
    return d, model


def test_train_per_language_beats_majority(labelled):
    d, model = labelled
    en = json.loads((model / "en" / "classifier.json").read_text())
    zh = json.loads((model / "zh" / "classifier.json").read_text())
    assert en["labels"] == sorted(["Computer Science and Engineering", "Mathematics and Physics", "Others"])
    assert zh["labels"] == ["Computer Science and Engineering", "Philosophy, Arts and Culture"]  # sorted
    assert en["metrics"]["n"] >= 60 and zh["metrics"]["n"] >= 40
    assert en["metrics"]["accuracy"] >= 0.85 and en["metrics"]["majority_accuracy"] < 0.45
    assert en["metrics"]["macro_f1"] >= 0.85
    assert zh["metrics"]["accuracy"] >= 0.9 and zh["metrics"]["accuracy"] - zh["metrics"]["majority_accuracy"] >= 0.3
    assert len(en["metrics"]["confusion"]) == 3
    manifest = json.loads((model / "_manifest.json").read_text())
    assert manifest["extra"]["en accuracy"] == pytest.approx(en["metrics"]["accuracy"])


def test_label_writes_lang_topic_score(labelled, tmp_path):
    d, model = labelled
    probe = ([{"id": f"py{i}", "text": r["text"]} for i, r in enumerate(python_docs(400)[1::20])]
             + [{"id": f"po{i}", "text": r["text"]} for i, r in enumerate(poems_zh(400)[1::20])]
             + [{"id": "fr", "text": "Le chat est sur la table et il dort tranquillement toute la journée."}])
    write_jsonl(tmp_path / "in" / "p.jsonl", probe)
    res = label_topics.run(compose_step("label-topics", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={tmp_path / 'out'}",
                                                         f"topics.model={model}", "quiet=true"]))
    out = {r["id"]: r for r in read_out(tmp_path / "out")}
    assert len(out) == len(probe) and 1 <= res["extra"]["no classifier for language"] <= 3
    assert out["fr"]["lang"] == "fr" and out["fr"]["topic"] is None
    py = [r for k, r in out.items() if k.startswith("py")]
    po = [r for k, r in out.items() if k.startswith("po")]
    assert sum(r["lang"] == "en" for r in py) >= len(py) - 2
    assert sum(r["lang"] == "zh" for r in po) >= len(po) - 1  # lid.176 calls one Tang poem Japanese (p=0.50)
    assert sum(r["topic"] == "Computer Science and Engineering" for r in py) >= 0.8 * len(py)
    assert sum(r["topic"] == "Philosophy, Arts and Culture" for r in po) >= 0.9 * len(po)
    assert all(0.0 <= r["topic_score"] <= 1.0 for r in py + po if r["topic"] is not None)


def test_label_errors(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "x"}])
    with pytest.raises(CptkitError, match="topics.model"):
        label_topics.run(compose_step("label-topics", [f"io.inputs=[{tmp_path / 'in.jsonl'}]", f"io.output={tmp_path / 'o'}"]))
    with pytest.raises(CptkitError, match="no classifier"):
        label_topics.run(compose_step("label-topics", [f"io.inputs=[{tmp_path / 'in.jsonl'}]", f"io.output={tmp_path / 'o'}",
                                                       f"topics.model={tmp_path}"]))
    write_jsonl(tmp_path / "l.jsonl", [{"id": "a", "text": "hello there", "topic": "Cooking", "lang": "en"}])
    r = runner.invoke(app, ["label-topics-train", "--in", str(tmp_path / "l.jsonl"), "--out", str(tmp_path / "m"), "-q"])
    assert r.exit_code != 0 and "'Cooking' is not in the en taxonomy" in str(r.exception)


@pytest.mark.slow
def test_annotate_with_the_embedded_llm(tmp_path):
    """Real zero-shot annotation with the embedded SmolLM2 (cptkit.llm, transformers backend)."""
    pages = python_docs(60)[::10] + poems_zh(60)[::20]
    write_jsonl(tmp_path / "corpus" / "c.jsonl", pages)
    out = tmp_path / "labels"
    res = label_topics_annotate.run(compose_step("label-topics-annotate", [
        f"io.inputs=[{tmp_path / 'corpus'}]", f"io.output={out}", "topics.sample=4", "topics.max_chars=300",
        "topics.max_new_tokens=10", "topics.annotate_mode=generate", "llm.cache=false", "quiet=true"]))
    stats = res["extra"]
    assert stats["sampled"] == 4
    mapped = sum(v for k, v in stats.items() if k.endswith(" mapped"))
    rejected = sum(v for k, v in stats.items() if k.endswith(" rejected"))
    assert mapped + rejected + stats["no taxonomy for language"] == 4
    recs = read_out(out) if mapped else []
    assert len(recs) == mapped
    for r in recs:
        assert r["topic"] in (EN.topics if r["lang"] == "en" else ZH.topics) and r["topic_answer"]
        assert r["topic_annotate_mode"] == "generate"
    rej = [json.loads(x) for x in (out / "_rejected.jsonl").read_text().splitlines()]
    assert len(rej) == rejected


def test_sample_is_order_free():
    recs = [{"id": f"r{i}", "text": "x"} for i in range(1000)]
    a = label_topics_annotate.bottom_k(recs, 50, seed=3)
    b = label_topics_annotate.bottom_k(reversed(recs), 50, seed=3)
    assert [r["id"] for r in a] == [r["id"] for r in b] and len(a) == 50
    assert [r["id"] for r in label_topics_annotate.bottom_k(recs, 50, seed=4)] != [r["id"] for r in a]
    assert len(label_topics_annotate.bottom_k(recs[:10], 50, seed=3)) == 10


# --- annotate_mode=loglikelihood -----------------------------------------------------------------
def test_pick_topic_norms_and_calibration():
    topics, lls, ntok = ["A", "Bbbb"], [-2.0, -4.0], [1, 2]
    best, p = pick_topic(topics, lls, ntok, "none")  # acc: raw sums
    assert best == 0 and p[0] == pytest.approx(1 / (1 + math.exp(-2.0))) and sum(p) == pytest.approx(1.0)
    best, p = pick_topic(topics, lls, ntok, "chars")  # acc_norm: -2/1 vs -4/4
    assert best == 1 and p[1] == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert pick_topic(topics, lls, ntok, "tokens")[0] == 0  # -2/1 vs -4/2
    best, p = pick_topic(topics, lls, ntok, "none", baseline=[-1.0, -5.0])  # -1 vs +1
    assert best == 1 and p[1] == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert pick_topic(["x", "y"], [-1.0, -1.0], [1, 1], "none") == (0, [0.5, 0.5])  # tie: first
    with pytest.raises(CptkitError, match="topics.norm=bytes"):
        pick_topic(topics, lls, ntok, "bytes")


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    """A real byte-level BPE tokenizer trained on real pages + a seeded random Llama, saved as a model dir."""
    from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer

    d = tmp_path_factory.mktemp("tiny-annotator")
    texts = [r["text"] for r in python_docs(80) + poems_zh(80)] + [build_prompt(EN, ""), build_prompt(ZH, "")]
    tok = train_bpe_tokenizer(texts, vocab_size=600)
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")
    tiny_llama(tok, hidden=32, layers=2, heads=2, max_position=2048, seed=0).save_pretrained(str(d))
    tok.save_pretrained(str(d))
    return d


def test_shared_context_scores_equal_lm_loglikelihood(tiny_chat_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cptkit.models.scoring import loglikelihood

    tok = AutoTokenizer.from_pretrained(str(tiny_chat_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_chat_model)).eval()
    page = python_docs(10)[3]["text"]
    assert truncate_tokens(tok, page, 0) == page and truncate_tokens(tok, "short", 50) == "short"
    cut = truncate_tokens(tok, page, 40)
    assert page.startswith(cut) and len(tok.encode(cut, add_special_tokens=False)) == 40
    for tax in (EN, ZH):
        context = tok.apply_chat_template([{"role": "user", "content": build_prompt(tax, cut)}],
                                          add_generation_prompt=True, tokenize=False)
        got = label_topics_annotate.topic_loglikelihoods(model, tok, context, tax.topics, batch_size=4)
        ref = loglikelihood(model, tok, [(context, t) for t in tax.topics], batch_size=5)
        assert [n for _, n in got] == [len(tok.encode(context + t)) - len(tok.encode(context)) for t in tax.topics]
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in ref], abs=1e-4)
        assert all(ll < 0 for ll, _ in got)


def test_annotate_loglikelihood_maps_every_page(tiny_chat_model, tmp_path):
    pages = python_docs(40)[::4] + poems_zh(40)[::4] + [
        {"id": "fr", "text": "Le chat dort sur la table toute la journée et ne se réveille que pour manger."}]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", pages[::2])
    write_jsonl(tmp_path / "corpus" / "b.jsonl", pages[1::2])
    args = [f"io.inputs=[{tmp_path / 'corpus'}]", "topics.annotate_mode=loglikelihood", "topics.sample=15", "topics.max_page_tokens=64",
            f"llm.model={tiny_chat_model}", "llm.device=cpu", "topics.topic_batch_size=4", "quiet=true"]
    res = label_topics_annotate.run(compose_step("label-topics-annotate", args + [f"io.output={tmp_path / 'out'}"]))
    stats = res["extra"]
    recs = read_out(tmp_path / "out")
    assert stats["sampled"] == 15 and len(recs) == 15 - stats["no taxonomy for language"]
    assert stats["en mapped"] + stats["zh mapped"] == len(recs) >= 13
    assert sum(v for k, v in stats.items() if k.endswith(" rejected")) == 0
    assert sum(v for k, v in stats.items() if k.startswith(("en: ", "zh: "))) == len(recs)
    assert (tmp_path / "out" / "_rejected.jsonl").read_text() == ""
    for r in recs:
        tax = EN if r["lang"] == "en" else ZH
        assert r["topic"] in tax.topics and 1 / len(tax.topics) <= r["topic_score"] <= 1.0
        assert r["topic_annotate_mode"] == "loglikelihood" and r["topic_annotator"] == str(tiny_chat_model)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["extra"]["annotate mode"] == "loglikelihood" and manifest["extra"]["annotate pages/s"] > 0
    again = label_topics_annotate.run(compose_step("label-topics-annotate", args + [f"io.output={tmp_path / 'again'}"]))
    assert again["extra"]["sampled"] == 15
    assert [(r["id"], r["topic"], r["topic_score"]) for r in read_out(tmp_path / "again")] == \
        [(r["id"], r["topic"], r["topic_score"]) for r in recs]  # deterministic


def test_loglikelihood_needs_a_local_model(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "x", "lang": "en"}])
    base = [f"io.inputs=[{tmp_path / 'in.jsonl'}]", f"io.output={tmp_path / 'o'}", "topics.annotate_mode=loglikelihood"]
    with pytest.raises(CptkitError, match="needs llm.backend=transformers, not openai; use topics.annotate_mode=generate"):
        label_topics_annotate.run(compose_step("label-topics-annotate", base + ["llm=openai"]))
    with pytest.raises(CptkitError, match="topics.annotate_mode=vote"):
        label_topics_annotate.run(compose_step("label-topics-annotate", base + ["topics.annotate_mode=vote"]))
    assert not (tmp_path / "o").exists()  # nothing half-written
    r = runner.invoke(app, ["label-topics-annotate", "--in", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o"),
                            "llm=openai", "topics.annotate_mode=loglikelihood", "-q"])
    assert r.exit_code != 0


@pytest.mark.slow
def test_annotate_loglikelihood_with_the_embedded_llm(tmp_path):
    """SmolLM2-135M, zero-shot, calibrated: Python docs are Computer Science more often than Tang poems.

    Observed (24 source-labelled pages, default settings): 6/24 match the source's topic, every
    page mapped; generate mode on the same pages: 2/24 mapped, 0 correct. The model is weak, so
    only the contrast between code and poetry is asserted.
    """
    py = [{**r, "lang": "en"} for r in python_docs(60)[::12][:4]]
    po = [{**r, "lang": "zh"} for r in poems_zh(60)[::10][:4]]
    write_jsonl(tmp_path / "corpus" / "c.jsonl", py + po)
    res = label_topics_annotate.run(compose_step("label-topics-annotate", [
        f"io.inputs=[{tmp_path / 'corpus'}]", f"io.output={tmp_path / 'out'}", "topics.sample=8", "quiet=true",
        "topics.annotate_mode=loglikelihood"]))
    assert res["extra"]["en mapped"] == 4 and res["extra"]["zh mapped"] == 4
    out = {r["id"]: r for r in read_out(tmp_path / "out")}
    assert len(out) == 8 and all(r["topic_annotator"] == "smollm2" for r in out.values())
    cs = "Computer Science and Engineering"
    py_cs = sum(out[r["id"]]["topic"] == cs for r in py)
    po_cs = sum(out[r["id"]]["topic"] == cs for r in po)
    assert py_cs >= 2 and po_cs == 0, {k: r["topic"] for k, r in out.items()}
    assert out["python-docs-00012"]["topic"] == cs  # the Python API page of the sample
