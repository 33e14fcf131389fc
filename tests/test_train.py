"""train: a tiny Llama with DeepSpeed ZeRO-2 bf16 on CPU, on streams built from real text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["model.hidden=32", "model.layers=2", "model.heads=2", "train.micro_batch=4", "train.threads=1",
          "train.lr=3e-3", "train.warmup=2", "quiet=true"]


@pytest.fixture(scope="module")
def stream(corpus_dir, corpus_records, tmp_path_factory):
    base = tmp_path_factory.mktemp("train")
    tok = make_tokenizer(corpus_records, base / "tok")
    out = base / "stream"
    build_stream(corpus_dir, tok, out, [*TWO_DOMAINS, "mix.budget_tokens=40000", "mix.seq_len=64",
                                        "mix.eval_docs=4"])
    return out


def train(stream: Path, out: Path, *overrides: str) -> dict:
    from cptkit.steps.train import run

    return run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *COMMON, *overrides]))


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_loss_goes_down_and_model_loads(stream, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res = train(stream, tmp_path / "r1", "train.mixture=static", "train.max_steps=30")
    m = metrics(tmp_path / "r1")
    assert [r["step"] for r in m] == list(range(1, 31))
    first, last = sum(r["loss"] for r in m[:3]) / 3, sum(r["loss"] for r in m[-3:]) / 3
    assert first > 6.0 and last < first - 0.5, (first, last)  # vocab 512: ln 512 = 6.24 at init
    assert m[0]["lr"] == pytest.approx(1e-7) and m[5]["lr"] == pytest.approx(3e-3)
    assert m[0]["weights"] == {"en": 0.5, "zh": 0.5}
    man = json.loads((tmp_path / "r1" / "_manifest.json").read_text())
    assert man["extra"]["steps"] == 30 and man["extra"]["engine"] == "torch"  # one CPU process: no ZeRO
    assert man["extra"]["kernels"] == "none"  # train.kernels' default: the model as transformers builds it
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "r1" / "model")
    tok = AutoTokenizer.from_pretrained(tmp_path / "r1" / "model")
    assert model.config.hidden_size == 32 and len(tok) == 512
    assert res["losses"][-1] == pytest.approx(m[-1]["loss"])


def test_keep_checkpoints_false_leaves_the_model_and_the_same_identity(stream, tmp_path, monkeypatch):
    from cptkit.training import checkpoint

    saved, save = [], checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda spec, *a: (saved.append(spec.out.name), save(spec, *a))[1])
    train(stream, tmp_path / "kept", "train.mixture=static", "train.max_steps=2")
    train(stream, tmp_path / "dropped", "train.mixture=static", "train.max_steps=2", "train.keep_checkpoints=false")
    assert saved == ["kept"]  # the last step's checkpoint is not written only to be deleted
    assert (tmp_path / "kept" / "checkpoints").is_dir() and not (tmp_path / "dropped" / "checkpoints").exists()
    assert (tmp_path / "dropped" / "_SUCCESS").exists() and (tmp_path / "dropped" / "model" / "config.json").exists()
    man = [json.loads((tmp_path / d / "_manifest.json").read_text()) for d in ("kept", "dropped")]
    assert man[0]["config_hash"] == man[1]["config_hash"]  # storage, not what the run computes
    with pytest.raises(CptkitError, match="no checkpoint of that step to extend"):
        train(stream, tmp_path / "dropped", "train.mixture=static", "train.max_steps=3", "train.resume=true")
    with pytest.raises(CptkitError, match=r"without its checkpoints \(train.keep_checkpoints=false\)"):
        train(stream, tmp_path / "branch", "train.mixture=static", "train.max_steps=3",
              f"train.branch_from={tmp_path / 'dropped'}")


def test_a_checkpoints_rng_states_are_the_seeds_whatever_ran_before(stream, tmp_path):
    import numpy as np
    import torch

    states = []
    for k, noise in enumerate((1, 2)):  # another caller's draws before the run: not in the checkpoint
        np.random.seed(noise)
        train(stream, tmp_path / f"r{k}", "train.mixture=static", "train.max_steps=2")
        [ck] = (tmp_path / f"r{k}" / "checkpoints").glob("step*/cptkit_state.pt")
        states.append(torch.load(ck, weights_only=True)["client_state"]["rng"])
    (n0, key0, *rest0), (n1, key1, *rest1) = (s["numpy"] for s in states)
    assert torch.equal(key0, key1) and rest0 == rest1
    assert states[0]["python"] == states[1]["python"] and torch.equal(states[0]["torch"], states[1]["torch"])


@pytest.mark.slow
def test_velocitune_proxy_targets_and_reweighting(stream, tmp_path):
    # 1) proxy run: default (token-share) weights, eval checkpoints, scaling-law targets
    # (a checkpoint every 2 of the real run's 16 steps, at most 0.75 of them; σ = 10 settles at the
    # first check, the 4th checkpoint, so the proxy stops after 8 steps)
    train(stream, tmp_path / "proxy", "train.velocitune.proxy=true", "train.max_steps=16",
          "train.velocitune.proxy_fraction=0.75", "train.velocitune.proxy_every=2", "train.velocitune.sigma=10")
    tg = json.loads((tmp_path / "proxy" / "_velocitune_targets.json").read_text())
    assert set(tg["targets"]) == {"en", "zh"} and len(tg["checkpoints"]) == 4
    assert tg["converged"] and tg["proxy_steps"] == 8 and len(metrics(tmp_path / "proxy")) == 8
    assert [c["tokens"] for c in tg["checkpoints"]] == [k * 2 * 4 * 64 for k in (1, 2, 3, 4)]
    assert tg["budget_tokens"] == 16 * 4 * 64  # extrapolated to the real run, not to the proxy's 8 steps
    # a run of another length refuses these targets
    with pytest.raises(CptkitError, match="extrapolated to 4096.0 tokens but this run trains 3072"):
        train(stream, tmp_path / "wrong", "train.mixture=velocitune", "train.max_steps=12",
              f"train.velocitune.targets_file='{tmp_path / 'proxy' / '_velocitune_targets.json'}'")
    for d, law in tg["laws"].items():
        assert law["beta"] > 0 and law["B"] >= 0 and tg["targets"][d] == pytest.approx(
            law["E"] + law["B"] / tg["budget_tokens"] ** law["beta"])
    # 2) velocitune with those targets; weights updated every 4 steps from uniform
    out = tmp_path / "vt"
    train(stream, out, "train.mixture=velocitune", "train.velocitune.interval_steps=4", "train.max_steps=16",
          f"train.velocitune.targets_file='{tmp_path / 'proxy' / '_velocitune_targets.json'}'")
    traj = [json.loads(x) for x in (out / "weights.jsonl").read_text().splitlines()]
    assert traj[0]["weights"] == {"en": 0.5, "zh": 0.5}
    ups = [t for t in traj if "velocity" in t]
    assert [t["step"] for t in ups] == [4, 8, 12]
    # the controller's evaluations are curve points at the tokens seen before their step, like eval_every's
    evals = [m for m in metrics(out) if "eval_loss" in m]
    assert evals and all(m["eval_tokens"] == m["tokens"] - 4 * 64 for m in evals if m.get("event") != "eval")
    # every update multiplies by exp(V): weight moves toward the domain with the larger velocity
    w = {"en": 0.5, "zh": 0.5}
    for t in ups:
        v = t["velocity"]
        slow = max(v, key=v.get)
        if abs(v["en"] - v["zh"]) > 1e-9:
            assert t["weights"][slow] > w[slow]
        w = t["weights"]
    total_v = {d: sum(t["velocity"][d] for t in ups) for d in w}
    slowest = max(total_v, key=total_v.get)
    assert w[slowest] > 0.5
    assert (out / "avg_weights.json").exists()
    avg = json.loads((out / "avg_weights.json").read_text())["weights"]
    assert 0.5 < avg[slowest] < w[slowest] + 1e-9
    try:
        import matplotlib  # noqa: F401
        assert (out / "weights.png").read_bytes()[:4] == b"\x89PNG"
    except ImportError:
        pass


def _cli(*args: str, env_extra: dict | None = None) -> list[str]:
    return [sys.executable, "-m", "cptkit.cli", "train", *args]


@pytest.mark.slow
def test_resume_after_sigkill_is_exact(stream, tmp_path):
    ov = ["train.mixture=dbl", "train.dbl.interval_steps=3", "train.velocitune.targets={en:4.0,zh:4.0}",
          "train.max_steps=24", "train.save_every=3"]
    train(stream, tmp_path / "ref", *ov)
    ref = metrics(tmp_path / "ref")
    out = tmp_path / "killed"
    args = ["--in", str(stream), "--out", str(out), *COMMON, *ov]
    env = dict(os.environ, PYTHONHASHSEED="0")
    p = subprocess.Popen(_cli(*args), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline:
        if (out / "metrics.jsonl").exists() and len(metrics(out)) >= 8:
            break
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = len(metrics(out))
    assert killed_at < 24 and not (out / "_SUCCESS").exists()
    r = subprocess.run(_cli(*args, "train.resume=true"), cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    got = metrics(out)
    assert [g["step"] for g in got] == list(range(1, 25))
    assert [g["loss"] for g in got] == [x["loss"] for x in ref]  # bit-identical
    assert [g["weights"] for g in got] == [x["weights"] for x in ref]
    assert (out / "_SUCCESS").exists()


@pytest.mark.slow
def test_two_processes_with_torchrun(stream, tmp_path):
    # global batch 4 sequences: 1 process × micro 4 == 2 processes × micro 2 (same data, same first loss)
    train(stream, tmp_path / "one", "train.max_steps=3")
    out = tmp_path / "two"
    port = 29500 + os.getpid() % 1000
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "cptkit.cli", "train", "--in", str(stream), "--out", str(out), *COMMON, "train.micro_batch=2",
           "train.max_steps=3"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = metrics(tmp_path / "one"), metrics(out)
    assert json.loads((out / "_manifest.json").read_text())["extra"]["world size"] == 2
    assert two[0]["loss"] == pytest.approx(one[0]["loss"], abs=2e-2)
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]
    assert (out / "model" / "config.json").exists()


def test_controllers_and_sampler_without_a_model(stream):
    import math

    import numpy as np

    from cptkit.mixtures.controller import TopicPPL
    from cptkit.mixtures.stream import Sampler, Stream

    # topic_ppl within parents: topics of one language share that language's mass
    doms = ["en/a", "en/b", "zh/c"]
    c = TopicPPL(doms, {"en/a": 0.4, "en/b": 0.4, "zh/c": 0.2}, {d: d.split("/")[0] for d in doms},
                 round_tokens=100, alpha=0.4)
    assert c.wants_eval(0, 0)
    c.update(0, 0, {"en/a": math.log(10), "en/b": math.log(20), "zh/c": math.log(5)})
    assert c.weights == {"en/a": 0.4, "en/b": 0.4, "zh/c": 0.2} and not c.wants_eval(1, 50) and c.wants_eval(2, 100)
    c.update(2, 100, {"en/a": math.log(12), "en/b": math.log(18), "zh/c": math.log(4)})
    # en: Δ = (+2, -2) → δ = (1, -1) → f = (1.4, 0.6) → (0.7, 0.3) of en's 0.8; zh alone keeps 0.2
    assert c.weights["en/a"] == pytest.approx(0.56) and c.weights["en/b"] == pytest.approx(0.24)
    assert c.weights["zh/c"] == pytest.approx(0.2)
    # staged: the sampler follows the stream's plan exactly; weighted draws are seeded and resumable
    s = Stream(stream)
    sp = Sampler(s, seed=0)
    pairs = sp.draw(10, None)
    assert pairs == [tuple(map(int, row)) for row in s.plan[:10]]
    a, b = Sampler(s, seed=1), Sampler(s, seed=1)
    a.draw(7, {"en": 0.5, "zh": 0.5})
    b.load_state_dict(a.state_dict())
    x, y = a.draw(5, {"en": 0.9, "zh": 0.1}), b.draw(5, {"en": 0.9, "zh": 0.1})
    assert x == y
    batch = a.batch(x)
    assert batch.shape == (5, 64) and batch.dtype == np.int64


@pytest.mark.slow
def test_continue_pretraining_the_embedded_smollm2(corpus_dir, smollm2, tmp_path):
    """model=hf model.path=smollm2: the GGUF is dequantized into a plain model that trains and saves."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cptkit.models import scoring

    stream = tmp_path / "stream"
    build_stream(corpus_dir, "smollm2", stream, ["mix.domains=[{name:en,filter:{source:python-docs}}]",
                                                 "mix.stages=[{name:main,weights:{en:1}}]", "mix.fill=null",
                                                 "mix.budget_tokens=2048", "mix.seq_len=128", "mix.eval_docs=2"])
    out = tmp_path / "run"
    train(stream, out, "model=hf", "model.path=smollm2", "train.max_steps=3", "train.micro_batch=2",
          "train.lr=1e-5", "train.warmup=0", "train.precision=fp32", "train.save_initial=true")
    m = metrics(out)
    # a trained model: ~2-3 nats per token on English documentation, far below ln(49152) = 10.8 at random
    assert 1.0 < m[0]["loss"] < 4.5, m[0]
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    init = AutoModelForCausalLM.from_pretrained(out / "model_init")
    text = [r["text"] for r in eval_records(stream)][0]
    (nll_i, n_i), = scoring.document_losses(init, tok, [text], max_length=128, max_tokens=128)
    (nll_t, n_t), = scoring.document_losses(model, tok, [text], max_length=128, max_tokens=128)
    assert n_i == n_t > 50 and nll_i / n_i < 4.5 and nll_t != nll_i  # model_init is the start, model moved
    gen = scoring.generate_until(model, tok, ["The capital of France is"], max_gen_toks=6, max_length=128)
    assert gen[0].strip(), gen  # it generates text


def eval_records(stream: Path) -> list[dict]:
    from cptkit.mixtures.stream import Stream

    return Stream(stream).eval_records()


def test_weights_plot_skips_the_stage_events_of_a_staged_run(tmp_path):
    """A staged run follows its plan, so its stage events record no weights (null): the plot must not
    fail on them (it did at the end of every multi-stage staged run, after training)."""
    import json

    from cptkit.training.outputs import plot_weights

    p = tmp_path / "weights.jsonl"
    rows = [{"step": 28, "tokens": 28672, "weights": None, "event": "stage", "stage": "tail"},
            {"step": 30, "tokens": 30720, "event": "end", "weights": {"domain": 0.25, "code": 0.75}}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_weights(p, tmp_path / "w.png") is None
    assert (tmp_path / "w.png").stat().st_size > 1000
    p.write_text(json.dumps(rows[0]) + "\n")
    assert plot_weights(p, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_arms_from_one_model_share_the_untrained_models_eval(stream, tmp_path, monkeypatch):
    """Every arm starting from the same saved model on the same held-out records computes the same
    step-0 losses: the first computes them, the others read them (a tampered entry shows the read);
    another eval setting, or the cache turned off, computes again."""
    monkeypatch.setenv("CPTKIT_CACHE", str(tmp_path / "cache"))
    train(stream, tmp_path / "base", "train.mixture=static", "train.max_steps=2")
    hf = ["model=hf", f"model.path={tmp_path / 'base' / 'model'}", "train.max_steps=2", "train.eval_every=2"]
    train(stream, tmp_path / "a", *hf, "train.mixture=static")
    [entry] = (tmp_path / "cache" / "init_eval").glob("*.json")
    first = metrics(tmp_path / "a")[0]["eval_loss"]
    saved = json.loads(entry.read_text())
    assert {d: v["loss"] for d, v in saved.items()} == first and set(first) == {"en", "zh"}
    entry.write_text(json.dumps({d: {**v, "loss": v["loss"] + 1.0} for d, v in saved.items()}))
    # a dynamic arm (its controller's own eval at step 0) reads the entry too
    train(stream, tmp_path / "b", *hf, "train.mixture=dbl", "train.dbl.interval_steps=1",
          "train.velocitune.targets={en:4.0,zh:4.0}")
    assert metrics(tmp_path / "b")[0]["eval_loss"] == pytest.approx({d: v + 1.0 for d, v in first.items()}, abs=1e-12)
    train(stream, tmp_path / "c", *hf, "train.mixture=static", "train.eval_max_tokens=32")  # another setting
    assert len(list((tmp_path / "cache" / "init_eval").glob("*.json"))) == 2
    assert metrics(tmp_path / "c")[0]["eval_loss"] != pytest.approx(first)
    monkeypatch.setenv("CPTKIT_INIT_EVAL_CACHE", "0")
    train(stream, tmp_path / "d", *hf, "train.mixture=static")
    assert metrics(tmp_path / "d")[0]["eval_loss"] == first  # computed again: the true numbers


@pytest.mark.slow(minutes=1)
def test_compiled_forward_trains_like_eager(stream, tmp_path):
    """train.compile=true: the torch engine's training forward goes through torch.compile (inductor on the
    CPU) and trains the same steps to the same losses as eager, up to float rounding; the saved model is the
    plain module (no ``_orig_mod.`` keys)."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    args = ["train.mixture=static", "train.max_steps=6", "train.precision=fp32"]
    counters.clear()
    train(stream, tmp_path / "eager", *args)
    assert not counters["stats"]["unique_graphs"]  # eager: dynamo never ran
    train(stream, tmp_path / "compiled", *args, "train.compile=true")
    assert counters["stats"]["unique_graphs"] >= 1  # the forward was captured and compiled
    eager, compiled = metrics(tmp_path / "eager"), metrics(tmp_path / "compiled")
    assert [r["tokens"] for r in eager] == [r["tokens"] for r in compiled]
    for a, b in zip(eager, compiled, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-4), (a["step"], a["loss"], b["loss"])
    man = json.loads((tmp_path / "compiled" / "_manifest.json").read_text())
    assert man["extra"]["compile"] == "on" and man["extra"]["engine"] == "torch"
    assert json.loads((tmp_path / "eager" / "_manifest.json").read_text())["extra"]["compile"] == "off"
    _, info = AutoModelForCausalLM.from_pretrained(tmp_path / "compiled" / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # plain keys, every weight loaded
