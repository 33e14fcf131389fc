"""label-topics(-train, -annotate): taxonomies, answer mapping, per-language classifiers on real text."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from classify_realtext import fortunes_en, manpages_zh, maxima_docs, poems_zh, python_docs
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.config import CONF_DIR, compose_step
from cptkit.errors import CptkitError
from cptkit.steps import label_topics, label_topics_annotate
from cptkit.text.langid import detect
from cptkit.topics import build_prompt, load_taxonomy, map_answer

runner = CliRunner()
EN = load_taxonomy(CONF_DIR / "topics" / "en.yaml")
ZH = load_taxonomy(CONF_DIR / "topics" / "zh.yaml")


def write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    return path


def read_out(d: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(d.glob("part-*.jsonl.gz")) for line in gzip.open(f, "rt")]


def test_taxonomies_from_the_paper():
    assert len(EN.topics) == 11 and EN.topics[0] == "Mathematics and Physics" and EN.topics[-1] == "Others"
    assert len(ZH.topics) == 13 and "Project and Practical Management" in ZH.topics
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
    assert map_answer("艺术与文化", ZH) == "Arts and Culture"
    assert map_answer("主题：计算机", ZH) == "Computer Science and Engineering"
    assert map_answer("Philosophy", ZH) == "Philosophy"
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
            + [{**r, "topic": "Arts and Culture"} for r in poems_zh(150)])
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
    assert zh["labels"] == ["Arts and Culture", "Computer Science and Engineering"]
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
    assert sum(r["topic"] == "Arts and Culture" for r in po) >= 0.9 * len(po)
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
        "topics.max_new_tokens=10", "llm.cache=false", "quiet=true"]))
    stats = res["extra"]
    assert stats["sampled"] == 4
    mapped = sum(v for k, v in stats.items() if k.endswith(" mapped"))
    rejected = sum(v for k, v in stats.items() if k.endswith(" rejected"))
    assert mapped + rejected + stats["no taxonomy for language"] == 4
    recs = read_out(out) if mapped else []
    assert len(recs) == mapped
    for r in recs:
        assert r["topic"] in (EN.topics if r["lang"] == "en" else ZH.topics) and r["topic_answer"]
    rej = [json.loads(x) for x in (out / "_rejected.jsonl").read_text().splitlines()]
    assert len(rej) == rejected


def test_sample_is_order_free():
    recs = [{"id": f"r{i}", "text": "x"} for i in range(1000)]
    a = label_topics_annotate.bottom_k(recs, 50, seed=3)
    b = label_topics_annotate.bottom_k(reversed(recs), 50, seed=3)
    assert [r["id"] for r in a] == [r["id"] for r in b] and len(a) == 50
    assert [r["id"] for r in label_topics_annotate.bottom_k(recs, 50, seed=4)] != [r["id"] for r in a]
    assert len(label_topics_annotate.bottom_k(recs[:10], 50, seed=3)) == 10
