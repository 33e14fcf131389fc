"""The recipes of docs/architecture.md, each run from a fixture file: an LLM backend of your own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from outputs import read_jsonl, records

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "fixtures" / "plugins"


def cptkit(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "cptkit.cli", *args], capture_output=True, text=True, env=env)


def test_an_llm_backend_of_your_own_runs_a_step(tmp_path):
    """llm.backend=echo_backend:EchoGenerator (tests/fixtures/plugins/echo_backend.py) drives expand-queries."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"id": "s1", "text": "mathematics", "domain": "STEM", "seed_type": "keyword"}\n')
    out = tmp_path / "q"
    r = cptkit("expand-queries", "--in", str(seeds), "--out", str(out), "llm.backend=echo_backend:EchoGenerator",
               "llm.cache=false", "expand.rounds=1", "expand.questions_per_seed=1", "-q")
    assert r.returncode == 0, r.stderr
    recs = records(out, "")
    questions = [x for x in recs if x["kind"] == "question"]
    assert questions and questions[0]["text"].startswith("Echo of the prompt: Suppose you are a question creator")
    assert questions[0]["meta"]["generator"]["backend"] == "echo"
    stats = json.loads((out / "_expand_stats.json").read_text())
    assert stats["generator"]["backend"] == "echo"


def test_a_backend_that_is_not_a_generator_is_one_line(tmp_path):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"id": "s1", "text": "x", "domain": "STEM", "seed_type": "keyword"}\n')
    for backend, why in (("echo_backend:Completion", "is not a cptkit.llm.Generator subclass"),
                         ("no_such_module:X", "cannot import X from no_such_module")):
        r = cptkit("expand-queries", "--in", str(seeds), "--out", str(tmp_path / "o"), f"llm.backend={backend}", "-q")
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0], r.stderr
        assert not (tmp_path / "o").exists()


def test_a_mixture_rule_of_your_own_reweights_training(tmp_path, corpus_dir, corpus_records):
    """train.mixture=worst_first:WorstFirst (tests/fixtures/plugins/worst_first.py): every 2 steps the
    weights become the domains' held-out losses, normalised; the run logs each update."""
    from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    build_stream(corpus_dir, tok, tmp_path / "s", [*TWO_DOMAINS, "mix.budget_tokens=8000", "mix.seq_len=64",
                                                    "mix.eval_docs=4"])
    r = cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / "run"), "-q", "model.hidden=32",
               "model.layers=1", "model.heads=2", "train.micro_batch=4", "train.threads=1", "train.max_steps=6",
               "train.warmup=0", "train.mixture=worst_first:WorstFirst")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "weights.jsonl").read_text().splitlines()]
    updates = [x for x in rows if "losses" in x]
    assert len(updates) >= 2
    for u in updates:  # weights ∝ losses: the rule ran, not a static mixture
        total = sum(u["losses"].values())
        assert u["weights"] == {d: pytest.approx(v / total, abs=1e-6) for d, v in u["losses"].items()}
    r = cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / "bad"), "-q",
               "train.mixture=worst_first:Nope")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "cannot import Nope from worst_first" in lines[0], r.stderr
    assert not (tmp_path / "bad").exists()  # nothing half-written


def test_a_mixture_rule_registered_by_name_is_built_from_the_run_s_options(tmp_path, corpus_dir, corpus_records,
                                                                           monkeypatch):
    """CONTROLLERS.register("behind_target", BehindTarget) (tests/fixtures/plugins/behind_target.py) and
    train.mixture=behind_target: the rule is built by its from_options, with the targets it reads from
    the run's MixtureOptions (train.velocitune.targets), and after its first update (after step 2) every
    batch is drawn from the one domain still above its target."""
    from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

    from cptkit.core.config import compose_step
    from cptkit.mixtures.controller import CONTROLLERS
    from cptkit.steps.train import run

    monkeypatch.syspath_prepend(str(PLUGINS))
    from behind_target import BehindTarget

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    build_stream(corpus_dir, tok, tmp_path / "s", [*TWO_DOMAINS, "mix.budget_tokens=8000", "mix.seq_len=64",
                                                    "mix.eval_docs=4"])
    out = tmp_path / "run"
    CONTROLLERS.register("behind_target", BehindTarget)
    try:  # zh's target is far above any loss: only en is behind
        run(compose_step("train", [f"io.inputs=['{tmp_path / 's'}']", f"io.output='{out}'", "quiet=true",
                                   "model.hidden=32", "model.layers=1", "model.heads=2", "train.micro_batch=4",
                                   "train.threads=1", "train.max_steps=6", "train.warmup=0",
                                   "train.mixture=behind_target", "train.velocitune.targets={en:0.0,zh:100.0}"]))
    finally:
        CONTROLLERS.unregister("behind_target")
    updates = [x for x in read_jsonl(out / "weights.jsonl") if "behind" in x]
    assert [u["step"] for u in updates] == [2, 4]
    assert all(u["behind"] == ["en"] and u["weights"] == {"en": 1.0, "zh": 0.0} for u in updates)
    rows = read_jsonl(out / "metrics.jsonl")
    drawn = {r["step"]: {d for x in r["draws"] for d, n in x["counts"].items() if n} for r in rows}
    assert "zh" in drawn[1] | drawn[2] and all(drawn[s] == {"en"} for s in range(3, 7)), drawn
    # named as a plugin, package.module:Class, it takes the same route: the same weights, step for step
    r = cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / "plugin"), "-q", "model.hidden=32",
               "model.layers=1", "model.heads=2", "train.micro_batch=4", "train.threads=1", "train.max_steps=6",
               "train.warmup=0", "train.mixture=behind_target:BehindTarget", "train.velocitune.targets={en:0.0,zh:100.0}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert read_jsonl(tmp_path / "plugin" / "weights.jsonl") == read_jsonl(out / "weights.jsonl")


def test_a_training_callback_of_your_own_survives_resume(tmp_path, corpus_dir, corpus_records):
    """train.callbacks=[loss_recorder:LossRecorder] (tests/fixtures/plugins/loss_recorder.py): a run
    stopped at step 4 and resumed to step 8 ends with the same recorded losses as an unbroken 8-step
    run: its state came back from the checkpoint (without it, the resumed run would hold steps 6, 8)."""
    from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

    from cptkit.training.checkpoint import safe_load

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    build_stream(corpus_dir, tok, tmp_path / "s", [*TWO_DOMAINS, "mix.budget_tokens=8000", "mix.seq_len=32"])

    def train(out: str, *args: str) -> dict:
        r = cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / out), "-q", "model.hidden=32",
                   "model.layers=1", "model.heads=2", "train.micro_batch=2", "train.threads=1", "train.warmup=0",
                   "train.engine=torch", "train.precision=fp32", "train.callbacks=[loss_recorder:LossRecorder]", *args)
        assert r.returncode == 0, r.stderr[-2000:]
        ck = safe_load(tmp_path / out / "checkpoints" / "step00000008" / "cptkit_state.pt")
        return ck["client_state"]["callbacks"]

    whole = train("whole", "train.max_steps=8")
    r = cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / "cut"), "-q", "train.max_steps=4",
               "model.hidden=32", "model.layers=1", "model.heads=2", "train.micro_batch=2", "train.threads=1",
               "train.warmup=0", "train.engine=torch", "train.precision=fp32",
               "train.callbacks=[loss_recorder:LossRecorder]")
    assert r.returncode == 0, r.stderr[-2000:]
    resumed = train("cut", "train.max_steps=8", "train.resume=true")
    got = resumed["loss_recorder:LossRecorder"]["losses"]
    assert [s for s, _ in got] == [2, 4, 6, 8]
    assert got == whole["loss_recorder:LossRecorder"]["losses"]
    assert set(resumed) == {"mixture", "evaluator", "metrics", "checkpointer", "loss_recorder:LossRecorder"}
    # a class that is not a Callback: one line naming the setting, nothing written
    r = cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / "bad"), "-q",
               "train.callbacks=[loss_recorder:Any]")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "train.callbacks=loss_recorder:Any" in lines[0], r.stderr


def test_a_classifier_backend_of_your_own_trains_saves_and_scores(tmp_path):
    """train.backend=word_votes:WordVotes (tests/fixtures/plugins/word_votes.py): score-quality-train
    trains and saves it, and score-quality loads it back by the name its classifier.json records, once
    quality.plugins allows that plugin (a model folder alone never makes cptkit import a module)."""
    hq = [{"id": f"h{i}", "text": f"the theorem proof lemma number {i} follows"} for i in range(40)]
    lq = [{"id": f"l{i}", "text": f"click here buy cheap deal number {i} now"} for i in range(40)]
    for name, rows in (("hq", hq), ("lq", lq)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tmp_path / "model"
    r = cptkit("score-quality-train", "--positives", str(tmp_path / "hq.jsonl"), "--negatives",
               str(tmp_path / "lq.jsonl"), "--out", str(model), "-q", "train.backend=word_votes:WordVotes")
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads((model / "classifier.json").read_text())
    assert info["backend"] == "word_votes:WordVotes" and info["labels"] == ["hq", "lq"] and info["words"] > 0
    assert info["metrics"]["accuracy"] == 1.0 and (model / "votes.json").is_file()
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "d1", "text": "a lemma and its proof"}) + "\n"
                    + json.dumps({"id": "d2", "text": "buy now, cheap"}) + "\n")
    # the folder names the plugin, but only the command line may allow importing it
    r = cptkit("score-quality", "--in", str(docs), "--out", str(tmp_path / "scored"), "-q", f"quality.model={model}")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "quality.plugins=[word_votes:WordVotes]" in lines[0], r.stderr
    assert not (tmp_path / "scored").exists()
    r = cptkit("score-quality", "--in", str(docs), "--out", str(tmp_path / "scored"), "-q", f"quality.model={model}",
               "quality.plugins=[word_votes:WordVotes]")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = records(tmp_path / "scored", "")
    assert rows[0]["quality"] > 0.5 > rows[1]["quality"]
    r = cptkit("score-quality-train", "--positives", str(tmp_path / "hq.jsonl"), "--negatives",
               str(tmp_path / "lq.jsonl"), "--out", str(tmp_path / "bad"), "-q", "train.backend=word_votes:Counter")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "is not a cptkit.labels.backends.base.ClassifierBackend" in lines[0]


def test_callbacks_by_name_with_arguments_stop_close_and_on_error(tmp_path, corpus_dir, corpus_records):
    """train.callbacks names a callback with arguments (tests/fixtures/plugins/stop_after.py) and turns a
    built-in off: the run ends where the callback's request_stop says, with its final checkpoint there,
    no evaluation points (evaluator off), and close called; a callback that raises gets on_error, then
    close, and the run fails. Turning off a built-in the run needs is one line, nothing written."""
    from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    build_stream(corpus_dir, tok, tmp_path / "s", [*TWO_DOMAINS, "mix.budget_tokens=8000", "mix.seq_len=32"])

    def train(out: str, *args: str) -> subprocess.CompletedProcess:
        return cptkit("train", "--in", str(tmp_path / "s"), "--out", str(tmp_path / out), "-q", "model.hidden=32",
                      "model.layers=1", "model.heads=2", "train.micro_batch=2", "train.threads=1", "train.warmup=0",
                      "train.engine=torch", "train.precision=fp32", "train.max_steps=6", "train.eval_every=2", *args)

    hooks = tmp_path / "hooks.txt"
    for hook in ("post_step", "pre_step"):  # asked after step 3, or before it: the run ends after step 3
        hooks.unlink(missing_ok=True)
        r = train(hook, f"train.callbacks=[{{name: stop_after:StopAfter, args: {{step: 3, hook: {hook}, "
                        f"log: '{hooks}'}}}}, {{name: evaluator, enabled: false}}]")
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [json.loads(x) for x in (tmp_path / hook / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in rows if "loss" in x] == [1, 2, 3]  # stopped after step 3, not 6
        assert not [x for x in rows if "eval_loss" in x]  # the evaluator was off
        assert sorted(p.name for p in (tmp_path / hook / "checkpoints").glob("step*")) == ["step00000003"]
        assert hooks.read_text().split() == ["pre_train", "close"]

    hooks.unlink()
    r = train("fail", f"train.callbacks=[{{name: stop_after:StopAfter, args: {{fail_at: 2, log: '{hooks}'}}}}]")
    assert r.returncode != 0 and "failing at step 2 as asked" in r.stderr, r.stderr[-2000:]
    assert hooks.read_text().split() == ["pre_train", "on_error:RuntimeError", "close"]
    assert not (tmp_path / "fail" / "_SUCCESS").exists()

    for bad, why in (("train.callbacks={mixture: {enabled: false}}", "the run cannot do without it"),
                     ("train.callbacks={checkpointer: {enabled: false}}", "train.keep_checkpoints=false"),
                     ("train.callbacks={evaluator: {every: 3}}", "a built-in takes no arguments"),
                     ("train.callbacks=[{name: stop_after:StopAfter, args: {nope: 1}}]", "cannot be built with")):
        r = train("bad", bad)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0], (bad, r.stderr[-2000:])
        assert not (tmp_path / "bad").exists()  # nothing half-written
