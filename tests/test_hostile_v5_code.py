"""Hostile input v5, data files that name code: a classifier folder's ``classifier.json`` may name
only a registered backend; importing a plugin is the command line's decision (``quality.plugins``),
never a downloaded model folder's (issue 53, case 11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "cptkit.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_classifier_folder_cannot_make_score_quality_import_a_module(tmp_path):
    """``"backend": "this:Nope"`` used to import the module ``this`` (the Zen of Python landed in
    ``--out -``); now it is one line naming the file, and nothing is imported."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "classifier.json").write_text(json.dumps({"backend": "this:Nope", "labels": ["hq", "lq"]}))
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "d1", "text": "a lemma and its proof"}) + "\n")
    for out in ("-", str(tmp_path / "scored")):
        r = run_cli("score-quality", "--in", str(docs), "--out", out, "-q", f"quality.model={model}")
        assert "Beautiful is better than ugly" not in r.stdout + r.stderr
        err = r.stderr.strip()
        assert r.returncode == 2 and len(err.splitlines()) == 1, r.stderr[-2000:]
        assert f"{model / 'classifier.json'}" in err and "not a registered one" in err, err
        assert r.stdout == ""
    assert not (tmp_path / "scored").exists()
    # label-topics reads <model>/<lang>/classifier.json the same way
    topics = tmp_path / "topics"
    (topics / "en").mkdir(parents=True)
    (topics / "en" / "classifier.json").write_text(json.dumps({"backend": "this:Nope", "labels": ["a"]}))
    r = run_cli("label-topics", "--in", str(docs), "--out", "-", "-q", f"topics.model={topics}",
                "topics.languages=[en]")
    assert "Beautiful is better than ugly" not in r.stdout + r.stderr
    assert r.returncode == 2 and "not a registered one" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_an_ensemble_member_cannot_name_a_module_either(tmp_path):
    """An ensemble's member folders are loaded under the same rule as the ensemble."""
    from cptkit.core.errors import CptkitError
    from cptkit.labels.classifiers import load_classifier

    model = tmp_path / "ens"
    (model / "members" / "0-this").mkdir(parents=True)
    (model / "classifier.json").write_text(json.dumps({"backend": "ensemble", "labels": ["a", "b"]}))
    (model / "members" / "0-this" / "classifier.json").write_text(json.dumps({"backend": "this:Nope"}))
    before = "this" in sys.modules
    try:
        load_classifier(model)
    except CptkitError as e:
        assert "0-this" in str(e) and "not a registered one" in str(e)
    else:
        raise AssertionError("an ensemble member naming a module was loaded")
    assert ("this" in sys.modules) == before
