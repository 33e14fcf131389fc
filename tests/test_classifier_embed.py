"""train.backend=embed: frozen MiniLM sentence embeddings ⊕ word n-gram TF-IDF under a multinomial
logistic regression, on real GCIDE dictionary senses labelled by their field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from classify_realtext import gcide_topics, python_docs
from conftest import read_jsonl_dir as read_out
from conftest import write_jsonl
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.config import compose_step
from cptkit.labels.backends.base import CLASSIFIER_JSON
from cptkit.labels.backends.embed import fit_logreg, ngram_vocabulary, tfidf_matrix, word_ngrams
from cptkit.labels.classifiers import load_classifier, save_classifier, train_classifier
from cptkit.labels.config import EmbedParams, TrainParams
from cptkit.steps import label_topics

runner = CliRunner()


@pytest.fixture(scope="module")
def senses():
    return [{**r, "lang": "en"} for r in gcide_topics(15)]  # 11 topics × 15 real senses


def test_ngrams_and_tfidf_by_hand():
    text = "The valve (of a Steam Engine) opens; the valve closes."
    assert word_ngrams(text)[:5] == ["the", "valve", "(", "of", "a"]
    assert "the valve" in word_ngrams(text) and "steam engine" in word_ngrams(text)
    docs = [word_ngrams(t) for t in ("a pump lifts water", "a pump and a valve", "the law of the land")]
    terms, idf = ngram_vocabulary(docs, 3)
    assert terms == ["a", "a pump", "pump"]  # most documents first, ties alphabetical
    assert idf[0] == pytest.approx(np.log(4 / 3) + 1) and idf[2] == pytest.approx(np.log(4 / 3) + 1)
    x = tfidf_matrix(docs, {t: i for i, t in enumerate(terms)}, idf).toarray()
    assert np.allclose(np.linalg.norm(x[:2], axis=1), 1.0) and not x[2].any()  # unknown n-grams only: zero row
    a_weight = (1 + np.log(2)) * idf[0]  # "a" twice in the second document
    assert x[1, 0] / x[1, 2] == pytest.approx(a_weight / idf[2])


def test_logreg_head_is_deterministic_and_fits(senses):
    docs = [word_ngrams(r["text"]) for r in senses]
    terms, idf = ngram_vocabulary(docs, 0)
    x = tfidf_matrix(docs, {t: i for i, t in enumerate(terms)}, idf)
    classes = sorted({r["topic"] for r in senses})
    y = np.array([classes.index(r["topic"]) for r in senses])
    w, b = fit_logreg(x, y, len(classes), c=10.0)
    w2, b2 = fit_logreg(x, y, len(classes), c=10.0)
    assert np.array_equal(w, w2) and np.array_equal(b, b2)
    assert w.shape == (len(terms), len(classes)) and b.shape == (len(classes),)
    assert ((x @ w + b).argmax(axis=1) == y).mean() >= 0.95  # separable on its own training senses


def test_embed_trains_saves_reloads_and_beats_majority(senses, tmp_path):
    ids, texts, labels = [r["id"] for r in senses], [r["text"] for r in senses], [r["topic"] for r in senses]
    params = TrainParams(backend="embed", heldout=0.25)
    res = train_classifier(ids, texts, labels, params, seed=0)
    m = res.metrics
    assert m["n"] >= 25 and m["majority_accuracy"] < 0.25
    assert m["accuracy"] >= m["majority_accuracy"] + 0.25 and m["macro_f1"] >= m["majority_macro_f1"] + 0.25
    tun = res.classifier.info["tuning"]
    assert [t["c"] for t in tun["trials"]] == EmbedParams().c and res.classifier.info["embed"]["c"] in EmbedParams().c
    save_classifier(res, tmp_path / "m", params, seed=0, extra={"language": "en"})
    info = json.loads((tmp_path / "m" / CLASSIFIER_JSON).read_text())
    assert info["backend"] == "embed" and info["metrics"]["macro_f1"] == m["macro_f1"]
    assert info["labels"] == sorted(set(labels)) and info["embed"]["terms"] > 100
    probe = texts[:5] + [python_docs(3)[2]["text"]]
    again = load_classifier(tmp_path / "m")
    p1, p2 = res.classifier.predict_proba(probe), again.predict_proba(probe)
    assert p1.shape == (6, 11) and np.allclose(p1.sum(axis=1), 1.0)
    assert np.allclose(p1, p2, rtol=0, atol=1e-9)
    embedding_only = train_classifier(ids, texts, labels, TrainParams(backend="embed", heldout=0.25,
                                                                      embed=EmbedParams(ngram_weight=0.0, c=[3.0])), 0)
    assert embedding_only.classifier.info["embed"]["terms"] == 0 and "tuning" not in embedding_only.classifier.info
    assert embedding_only.metrics["macro_f1"] >= m["majority_macro_f1"] + 0.25


def test_label_topics_train_and_label_with_embed(senses, tmp_path):
    write_jsonl(tmp_path / "labels" / "a.jsonl", senses)
    model = tmp_path / "models"
    r = runner.invoke(app, ["label-topics-train", "--in", str(tmp_path / "labels"), "--out", str(model), "-q",
                            "train.backend=embed", "topics.languages=[en]", "train.embed.c=[10]"])
    assert r.exit_code == 0, r.output
    info = json.loads((model / "en" / CLASSIFIER_JSON).read_text())
    assert info["backend"] == "embed" and info["embed"]["c"] == 10.0 and info["params"]["backend"] == "embed"
    assert info["metrics"]["macro_f1"] > info["metrics"]["majority_macro_f1"] + 0.2
    metrics = json.loads((model / "en" / "metrics.json").read_text())
    assert metrics["metrics"]["accuracy"] == info["metrics"]["accuracy"] and metrics["embed"]["c"] == 10.0
    manifest = json.loads((model / "_manifest.json").read_text())
    assert manifest["extra"]["en macro-F1"] == pytest.approx(info["metrics"]["macro_f1"])
    assert manifest["extra"]["en embedding head"].startswith("C 10, n-gram weight 1")
    probe = [{"id": r["id"], "text": r["text"], "lang": "en"} for r in gcide_topics(3, offset=15)]
    write_jsonl(tmp_path / "in" / "p.jsonl", probe)
    label_topics.run(compose_step("label-topics", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={tmp_path / 'out'}",
                                                   f"topics.model={model}", "topics.languages=[en]", "quiet=true"]))
    out = read_out(tmp_path / "out")
    assert len(out) == len(probe) and all(r["topic"] in info["labels"] for r in out)
    assert all(1 / 11 <= r["topic_score"] <= 1.0 for r in out)


def test_ensemble_averages_its_members_and_round_trips(senses, tmp_path):
    """train.backend=ensemble: each member trained on the same split; the probabilities are their mean,
    and the saved folder loads back to the same numbers."""
    write_jsonl(tmp_path / "labels" / "a.jsonl", senses)
    model = tmp_path / "models"
    r = runner.invoke(app, ["label-topics-train", "--in", str(tmp_path / "labels"), "--out", str(model), "-q",
                            "train.backend=ensemble", "train.ensemble_members=[fasttext,embed]", "train.tune.mode=off",
                            "topics.languages=[en]", "train.embed.c=[10]"])
    assert r.exit_code == 0, r.output
    info = json.loads((model / "en" / CLASSIFIER_JSON).read_text())
    assert info["backend"] == "ensemble" and info["members"] == ["fasttext", "embed"]
    assert info["metrics"]["macro_f1"] > info["metrics"]["majority_macro_f1"] + 0.2
    manifest = json.loads((model / "_manifest.json").read_text())
    assert manifest["extra"]["en ensemble"] == "fasttext + embed, probabilities averaged"
    assert manifest["extra"]["en [embed] embedding head"].startswith("C 10")
    clf = load_classifier(model / "en")
    ft, emb = (load_classifier(model / "en" / "members" / d) for d in ("0-fasttext", "1-embed"))
    probe = [r["text"] for r in gcide_topics(2, offset=15)]
    p = clf.predict_proba(probe)
    assert p.shape == (len(probe), 11) and np.allclose(p.sum(axis=1), 1.0)
    assert np.allclose(p, (ft.predict_proba(probe) + emb.predict_proba(probe)) / 2, rtol=0, atol=1e-12)
    assert ft.labels == emb.labels == clf.labels == info["labels"]
    with pytest.raises(Exception, match="not a backend"):
        train_classifier([r["id"] for r in senses], [r["text"] for r in senses], [r["topic"] for r in senses],
                         TrainParams(backend="ensemble", ensemble_members=["fasttext", "bogus"], heldout=0.2), 0)
