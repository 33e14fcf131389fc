"""train's engines, checkpoints and input checks: DeepSpeed configs, planted checkpoints, extension, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

from cptkit.core.config import compose_step

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["model.hidden=32", "model.layers=1", "model.heads=2", "train.micro_batch=4", "train.threads=1",
          "train.lr=3e-3", "train.warmup=2", "quiet=true"]


@pytest.fixture(scope="module")
def stream(corpus_dir, corpus_records, tmp_path_factory):
    base = tmp_path_factory.mktemp("train_engine")
    tok = make_tokenizer(corpus_records, base / "tok")
    out = base / "stream"
    build_stream(corpus_dir, tok, out, [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=32",
                                        "mix.eval_docs=2"])
    return out


def train(stream: Path, out: Path, *overrides: str) -> dict:
    from cptkit.steps.train import run

    return run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *COMMON, *overrides]))


def cli(stream: Path, out: Path, *overrides: str, cwd: Path = ROOT, common: list[str] = COMMON
        ) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "cptkit.cli", "train", "--in", str(stream), "--out", str(out),
                           *common, *overrides], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def manifest(out: Path) -> dict:
    return json.loads((out / "_manifest.json").read_text())


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# --- engines and DeepSpeed configs ---------------------------------------------------------------
def test_engine_choice_and_precision_rules():
    from cptkit.core.errors import CptkitError
    from cptkit.training.engine import deepspeed_config, resolve_precision, use_deepspeed

    # auto: one CPU process runs torch; DeepSpeed for ZeRO-3, a user file or several processes
    assert not use_deepspeed("auto", 1, False, 2)
    assert use_deepspeed("auto", 1, False, 3) and use_deepspeed("auto", 1, True, 0) and use_deepspeed("auto", 2, False, 2)
    with pytest.raises(CptkitError, match="one process"):
        use_deepspeed("torch", 2, False, 0)
    assert resolve_precision("fp32") == "fp32" and resolve_precision("auto") in ("bf16", "fp32")
    kw = dict(micro_batch=4, grad_accum=2, world=1, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
              grad_clip=1.0)
    base = {"zero_optimization": {"stage": 2, "overlap_comm": False}}
    # the user file wins over the group: stage, optimizer, scheduler, clipping; group keys it lacks remain
    user = {"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5,
            "optimizer": {"type": "Adam", "params": {"lr": 5e-4}}, "scheduler": {"type": "WarmupLR", "params": {}}}
    cfg = deepspeed_config(base, precision="fp32", zero_stage=None, user=user, **kw)
    assert cfg["zero_optimization"] == {"stage": 1, "overlap_comm": False}
    assert cfg["optimizer"]["type"] == "Adam" and cfg["optimizer"]["params"]["lr"] == 5e-4
    assert cfg["scheduler"]["type"] == "WarmupLR" and cfg["gradient_clipping"] == 0.5
    assert cfg["train_batch_size"] == 8 and cfg["bf16"]["enabled"] is False
    # without a user file: the group's stage, cptkit's AdamW, no DeepSpeed scheduler
    cfg = deepspeed_config({**base, "scheduler": {"type": "x"}}, precision="bf16", zero_stage=None, **kw)
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["optimizer"]["type"] == "AdamW" and "scheduler" not in cfg
    assert cfg["bf16"]["enabled"] is True
    # conflicts are errors, not silent choices
    with pytest.raises(CptkitError, match="contradicts train.zero_stage=3"):
        deepspeed_config(base, precision="fp32", zero_stage=3, user={"zero_optimization": {"stage": 1}}, **kw)
    with pytest.raises(CptkitError, match="train_micro_batch_size_per_gpu=8 disagrees"):
        deepspeed_config(base, precision="fp32", zero_stage=None, user={"train_micro_batch_size_per_gpu": 8}, **kw)
    with pytest.raises(CptkitError, match="contradicts train.precision=fp32"):
        deepspeed_config(base, precision="fp32", zero_stage=None, user={"bf16": {"enabled": True}}, **kw)


def test_deepspeed_zero3_means_stage_3(stream, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "z3"
    train(stream, out, "deepspeed=zero3", "train.max_steps=3", "train.precision=fp32")
    ex = manifest(out)["extra"]
    assert ex["engine"] == "deepspeed" and ex["zero stage"] == 3  # the engine's own zero_optimization_stage()
    m = metrics(out)
    assert len(m) == 3 and all(r["loss"] > 0 for r in m)
    # ZeRO-3 shards every parameter: the saved model is the gathered one, full shapes, not empty tensors
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert model.model.embed_tokens.weight.shape == (512, 32)
    assert float(model.model.embed_tokens.weight.abs().sum()) > 0


def test_user_deepspeed_file_wins(stream, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.99], "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3,
                                                     "warmup_num_steps": 4, "warmup_type": "linear"}}}))
    out = tmp_path / "user"
    train(stream, out, f"train.deepspeed_config='{ds}'", "train.max_steps=6", "train.precision=fp32")
    ex = manifest(out)["extra"]
    assert ex["engine"] == "deepspeed" and ex["zero stage"] == 1 and ex["lr scheduler"] == "deepspeed (user file)"
    lrs = [r["lr"] for r in metrics(out)]
    # the user's WarmupLR: from warmup_min_lr 0 up by 2e-3 / 4 per step to 2e-3 (DeepSpeed steps it once at
    # start, so the ramp begins at the second step); cptkit's own would be 1e-7, 3e-3, 3e-3, ... (train.lr=3e-3)
    assert lrs == pytest.approx([0.0, 0.0, 5e-4, 1e-3, 1.5e-3, 2e-3])
    # an explicit train.zero_stage that contradicts the file: one line, nothing written
    r = cli(stream, tmp_path / "conflict", f"train.deepspeed_config={ds}", "train.zero_stage=2", "train.max_steps=2")
    one_line_error(r, "zero_optimization.stage=1 contradicts train.zero_stage=2")
    assert not (tmp_path / "conflict").exists()


# --- what a run shows ---------------------------------------------------------------------------
def test_run_visibility_tensorboard_log_lines_and_plots(stream, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "vis"
    loud = [x for x in COMMON if x != "quiet=true"]
    r = cli(stream, out, "train.max_steps=4", "train.eval_every=2", "train.log_every=2", common=loud)
    assert r.returncode == 0, r.stderr[-2000:]
    # stderr is a pipe here, not a terminal: a progress line every train.log_every steps, with loss and LR
    m = [x for x in metrics(out) if "seconds" in x]
    for step in (2, 4):
        row = m[step - 1]
        want = f"step {step}/4  loss {row['loss']:.4f}  lr {row['lr']:.3g}"
        assert want in r.stderr, r.stderr[-3000:]
    assert "step 1/4" not in r.stderr and "step 3/4" not in r.stderr
    # TensorBoard: loss, LR, tokens/s, weights and per-domain eval losses, the same numbers as metrics.jsonl
    ea = EventAccumulator(str(out / "tensorboard"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"loss", "lr", "tokens_per_s", "weights/en", "weights/zh", "eval_loss/en", "eval_loss/zh"} <= tags, tags
    assert [e.value for e in ea.Scalars("loss")] == pytest.approx([x["loss"] for x in m], rel=1e-6)
    assert [e.step for e in ea.Scalars("lr")] == [1, 2, 3, 4]
    evals = [x for x in metrics(out) if "eval_loss" in x]
    assert len(ea.Scalars("eval_loss/en")) == len(evals) >= 2
    # plots: the loss curve, and a static run's weight trajectory spans the run (init row and end row)
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    w = [json.loads(x) for x in (out / "weights.jsonl").read_text().splitlines()]
    assert w[0]["tokens"] == 0 and w[-1]["event"] == "end" and w[-1]["tokens"] == 4 * 4 * 32
    assert w[-1]["weights"] == {"en": 0.5, "zh": 0.5}
    assert (out / "weights.png").read_bytes()[:4] == b"\x89PNG"


def test_wandb_is_optional():
    from cptkit.core.errors import CptkitError
    from cptkit.training.monitor import flatten, wandb_wanted

    try:
        import wandb  # noqa: F401
        installed = True
    except ImportError:
        installed = False
    assert wandb_wanted("false") is False
    if not installed:
        assert wandb_wanted("auto") is False  # never required
        with pytest.raises(CptkitError, match="pip install wandb"):
            wandb_wanted("true")
    assert flatten({"step": 3, "loss": 2.5, "weights": {"en": 0.25}, "event": "x", "ok": True}) == {
        "loss": 2.5, "weights/en": 0.25}


# --- resume, extension, planted checkpoints ------------------------------------------------------
def test_finished_run_extends_to_more_steps_exactly(stream, tmp_path):
    ref = tmp_path / "ref"
    train(stream, ref, "train.max_steps=9")
    out = tmp_path / "run"
    train(stream, out, "train.max_steps=6")
    assert (out / "_SUCCESS").exists()
    r = cli(stream, out, "train.max_steps=9")  # without resume: refused, the finished run is untouched
    one_line_error(r, "finished at step 6", "train.resume=true")
    assert (out / "_SUCCESS").exists() and len(metrics(out)) == 6
    res = train(stream, out, "train.max_steps=9", "train.resume=true")
    assert res["extra"]["steps"] == 9 and (out / "_SUCCESS").exists() and manifest(out)["extra"]["steps"] == 9
    got, want = metrics(out), metrics(ref)
    assert [g["step"] for g in got] == list(range(1, 10))
    assert [g["loss"] for g in got] == [w["loss"] for w in want]  # bit-identical to one 9-step run
    assert [g["lr"] for g in got] == [w["lr"] for w in want]
    assert (out / "checkpoints" / "latest").read_text() == "step00000009"
    # the same step count again is a finished output: nothing to do
    assert train(stream, out, "train.max_steps=9", "train.resume=true")["skipped"] is True
    # an unfinished run with checkpoints starts over with io.overwrite=true, as the refusal suggests
    (out / "_SUCCESS").unlink()
    r = cli(stream, out, "train.max_steps=3")
    one_line_error(r, "holds checkpoints of an unfinished run", "io.overwrite=true")
    train(stream, out, "train.max_steps=3", "io.overwrite=true")
    assert [g["loss"] for g in metrics(out)] == [w["loss"] for w in want[:3]]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step00000003"]


class _Planted:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_planted_checkpoint_is_refused_without_running_it(stream, tmp_path, engine):
    out = tmp_path / "run"
    train(stream, out, f"train.engine={engine}", "train.max_steps=2", "train.precision=fp32")
    tag_dir = out / "checkpoints" / "step00000002"
    name = "cptkit_state.pt" if engine == "torch" else "mp_rank_00_model_states.pt"
    assert (tag_dir / name).exists()
    marker = tmp_path / "PWNED"
    torch.save({"module": _Planted(marker)}, tag_dir / name)
    (out / "_SUCCESS").unlink()  # make it an unfinished run to resume
    r = cli(stream, out, f"train.engine={engine}", "train.max_steps=2", "train.precision=fp32", "train.resume=true")
    line = one_line_error(r, name, "refusing to load", "system")
    assert "not plain tensor data" in line
    assert not marker.exists()
    # a 'latest' that points outside the checkpoint folder is refused too
    (out / "checkpoints" / "latest").write_text("../../../etc")
    r = cli(stream, out, f"train.engine={engine}", "train.max_steps=2", "train.precision=fp32", "train.resume=true")
    one_line_error(r, "not a checkpoint tag")


def test_safe_load_reads_both_engines_checkpoints(tmp_path):
    """The allow-list covers what DeepSpeed's ZeRO state holds; plain containers load; code does not run."""
    from cptkit.core.errors import CptkitError
    from cptkit.training.checkpoint import safe_globals, safe_load

    names = {f"{c.__module__}.{c.__qualname__}" for c in safe_globals()}
    assert names == {"deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.runtime.zero.config.ZeroStageEnum",
                     "deepspeed.utils.tensor_fragment.fragment_address"}
    p = tmp_path / "ok.pt"
    torch.save({"a": torch.ones(2), "b": [1, (2, 3)], "rng": torch.get_rng_state(), "big": 2**80}, p)
    assert safe_load(p)["big"] == 2**80
    marker = tmp_path / "ran"
    torch.save([_Planted(marker)], tmp_path / "bad.pt")
    with pytest.raises(CptkitError, match="refusing to load"):
        safe_load(tmp_path / "bad.pt")
    assert not marker.exists()
    (tmp_path / "trunc.pt").write_bytes(p.read_bytes()[:40])
    with pytest.raises(CptkitError, match="refusing to load"):
        safe_load(tmp_path / "trunc.pt")


# --- bad input: one line, exit 2, nothing written ------------------------------------------------
@pytest.mark.parametrize("override, needle", [
    ("train.max_steps=-5", "train.max_steps=-5: must be ≥ 0"),
    ("train.micro_batch=0", "train.micro_batch=0: must be ≥ 1"),
    ("train.decay_type=foo", "train.decay_type=foo: use one of linear, cosine, 1-sqrt, exponential"),
    ("train.precision=fp8", "train.precision=fp8"),
    ("train.kernels=triton", "train.kernels=triton: use one of none, liger"),
    ("train.controller_stages=[{a:1}]", "train.controller_stages=[{'a': 1}]: give a stage's name or a list of them"),
])
def test_bad_options_are_one_line(stream, tmp_path, override, needle):
    out = tmp_path / "out"
    r = cli(stream, out, override)
    one_line_error(r, needle)
    assert not out.exists()


def test_the_mixture_options_are_the_train_settings_the_mixture_reads():
    """TrainOptions.mixture_options(): what mixtures/ builds the run's mixture from; one stage's name
    is that stage (it once became its letters), a list is its names as strings."""
    from cptkit.training.config import TrainOptions

    t = TrainOptions(mixture="dbl", weights={"en": 1}, init_weights="uniform", controller_stages="tail")
    o = t.mixture_options()
    assert (o.mixture, o.weights, o.init_weights, o.weights_from) == ("dbl", {"en": 1}, "uniform", None)
    assert o.controller_stages == ["tail"] and (o.topic_ppl, o.velocitune, o.dbl) == (t.topic_ppl, t.velocitune, t.dbl)
    assert TrainOptions(controller_stages=["main", 2]).mixture_options().controller_stages == ["main", "2"]
    assert TrainOptions().mixture_options().controller_stages is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_liger_kernels_without_cuda_is_one_line(stream, tmp_path):
    out = tmp_path / "out"
    r = cli(stream, out, "train.kernels=liger", "train.max_steps=1")
    one_line_error(r, "train.kernels=liger needs a CUDA GPU")
    assert not out.exists()


def test_the_engine_kind_dispatches_and_its_value_is_the_manifest_row(stream, tmp_path):
    """make_engine says which engine runs as an EngineKind (what resume and branching dispatch on); the
    manifest's ``engine`` row is its value."""
    from cptkit.core.errors import CptkitError
    from cptkit.models.lm import load_tokenizer
    from cptkit.models.tiny import tiny_llama
    from cptkit.training.checkpoint import check_resumable
    from cptkit.training.config import TrainOptions
    from cptkit.training.engine import make_engine
    from cptkit.training.schedule import make_schedule
    from cptkit.training.state import EngineKind

    tok = load_tokenizer(json.loads((stream / "_stream.json").read_text())["tokenizer"])
    engine, kind, info = make_engine(tiny_llama(tok, hidden=16, layers=1, heads=2),
                                     TrainOptions(engine="torch", precision="fp32"), deepspeed_base={}, world=1,
                                     schedule=make_schedule(1e-3, 4, warmup=0))
    assert kind is EngineKind.TORCH and info["engine"] == "torch" == kind.value
    engine.save_checkpoint(str(tmp_path / "ck"), "step00000000", {})
    assert check_resumable(tmp_path / "ck", kind) == "step00000000"
    with pytest.raises(CptkitError, match="written by the torch engine"):
        check_resumable(tmp_path / "ck", EngineKind.DEEPSPEED)


def test_liger_kernels_refuse_zero3_before_touching_the_model(stream):
    from cptkit.core.errors import CptkitError
    from cptkit.models.lm import load_tokenizer
    from cptkit.models.tiny import tiny_llama
    from cptkit.training.config import TrainOptions
    from cptkit.training.engine import make_engine
    from cptkit.training.schedule import make_schedule

    tok = load_tokenizer(json.loads((stream / "_stream.json").read_text())["tokenizer"])
    model = tiny_llama(tok, hidden=16, layers=1, heads=2)
    tcfg = TrainOptions(kernels="liger", zero_stage=3, engine="deepspeed", precision="fp32")
    with pytest.raises(CptkitError, match="train.kernels=liger is refused under ZeRO-3"):
        make_engine(model, tcfg, deepspeed_base={"zero_optimization": {"stage": 2}}, world=1,
                    schedule=make_schedule(1e-3, 4, warmup=0))
    assert "forward" not in model.__dict__


def test_kernel_routing_keeps_loss_and_eval_logits(stream):
    """train.kernels=liger sends calls with labels (the training loss) to Liger's fused forward and all
    others (evaluation's boolean logits_to_keep, which that forward cannot take) to the class's forward.
    Here the "fused" forward is the class's own, observed: the loss and the eval logits stay bit-identical."""
    from cptkit.models.lm import load_tokenizer
    from cptkit.models.scoring import _logits_at
    from cptkit.models.tiny import tiny_llama
    from cptkit.training.kernels import apply_kernels, route_labels

    tok = load_tokenizer(json.loads((stream / "_stream.json").read_text())["tokenizer"])
    model = tiny_llama(tok, hidden=32, layers=2, heads=4, intermediate=64, kv_heads=2)
    model.train()
    assert apply_kernels(model, "none") == "none" and "forward" not in model.__dict__  # none: untouched
    x = torch.randint(0, len(tok), (2, 16), generator=torch.Generator().manual_seed(0))
    keep = torch.rand(2, 15, generator=torch.Generator().manual_seed(1)) > 0.5
    loss = model(input_ids=x, labels=x).loss
    ref_logits = _logits_at(model, keep, input_ids=x[:, :15])
    calls = []

    def fused(*a, **kw):
        calls.append(sorted(kw))
        return type(model).forward(model, *a, **kw)

    route_labels(model, fused)
    got = model(input_ids=x, labels=x).loss
    assert calls == [["input_ids", "labels"]] and torch.equal(got, loss)
    assert torch.equal(_logits_at(model, keep, input_ids=x[:, :15]), ref_logits) and len(calls) == 1
    manual = torch.nn.functional.cross_entropy(model(input_ids=x).logits[:, :-1].flatten(0, 1).float(),
                                               x[:, 1:].flatten())  # the loss's meaning: mean NLL, shifted by one
    assert torch.allclose(got, manual, atol=1e-6) and len(calls) == 1


def test_truncated_safetensors_is_one_line(stream, corpus_records, tmp_path):
    from cptkit.models.lm import load_tokenizer
    from cptkit.models.tiny import tiny_llama

    tok = load_tokenizer(json.loads((stream / "_stream.json").read_text())["tokenizer"])
    model_dir = tmp_path / "m"
    tiny_llama(tok, hidden=16, layers=1, heads=2).save_pretrained(model_dir)
    f = model_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    out = tmp_path / "out"
    r = cli(stream, out, "model=hf", f"model.path={model_dir}", "train.max_steps=1")
    one_line_error(r, f"model {model_dir}: cannot load")
    assert not out.exists()


def _broken_copy(stream: Path, dst: Path) -> Path:
    shutil.copytree(stream, dst)
    return dst


def _edit_meta(s: Path, fn) -> None:
    meta = json.loads((s / "_stream.json").read_text())
    fn(meta)
    (s / "_stream.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("case", ["truncated_bin", "malformed_json", "missing_plan", "outside_path", "missing_key"])
def test_bad_streams_are_one_line(stream, tmp_path, case):
    s = _broken_copy(stream, tmp_path / "s")
    if case == "truncated_bin":
        f = s / "tokens" / "d000.bin"
        f.write_bytes(f.read_bytes()[:1001])
        needle = "d000.bin: 1,001 bytes"
    elif case == "malformed_json":
        (s / "_stream.json").write_text((s / "_stream.json").read_text()[:50])
        needle = "_stream.json: malformed JSON"
    elif case == "missing_plan":
        (s / "plan.npy").unlink()
        needle = "plan.npy: the stream's plan is missing"
    elif case == "outside_path":
        _edit_meta(s, lambda m: m["domains"][0].update(file="../../../etc/passwd"))
        needle = "points outside the stream directory"
    else:
        _edit_meta(s, lambda m: m.pop("seq_len"))
        needle = "no 'seq_len'"
    out = tmp_path / "out"
    r = cli(s, out, "train.max_steps=1")
    one_line_error(r, needle)
    assert not out.exists()


def test_stream_tokenizer_path_is_absolute_and_train_runs_elsewhere(corpus_dir, corpus_records, tmp_path):
    from cptkit.core.errors import CptkitError
    from cptkit.mixtures.stream import Stream

    tok = make_tokenizer(corpus_records, tmp_path / "work" / "tok")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "build-mix", "--in", str(corpus_dir), "--out", "stream",
                        "tokenizer=tok", "-q", *TWO_DOMAINS, "mix.budget_tokens=4000", "mix.seq_len=32"],
                       cwd=tmp_path / "work", env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    s = tmp_path / "work" / "stream"
    meta = json.loads((s / "_stream.json").read_text())
    assert meta["tokenizer"] == str(tok.resolve())
    assert Stream(s).tokenizer_spec() == str(tok.resolve())
    # from another directory: trains with the recorded tokenizer
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli(s, tmp_path / "run", "train.max_steps=1", cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-2000:]
    # an old stream recording a relative path that exists nowhere: one clear line
    _edit_meta(s, lambda m: m.update(tokenizer="some/rel/tok"))
    with pytest.raises(CptkitError, match="relative path found neither"):
        Stream(s).tokenizer_spec()


def test_gradient_checkpointing_auto_depends_on_size_and_device():
    """auto: on from 1e8 parameters on a GPU, from 1e9 on CPU (RAM is not the limit there); forced values win."""
    from cptkit.training.engine import checkpointing_wanted

    small = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters
    big = torch.nn.Embedding(150_000, 1000)  # 1.5e8: SmolLM2-135M's size class, no memory allocated for grads
    assert checkpointing_wanted("auto", big, gpu=True) and not checkpointing_wanted("auto", big, gpu=False)
    assert not checkpointing_wanted("auto", small, gpu=True)
    assert checkpointing_wanted(True, small, gpu=False) and not checkpointing_wanted("false", big, gpu=True)


def test_checkpoints_restore_every_callback_and_read_older_ones():
    """A checkpoint's client state holds every callback's state by key; resume restores each one (a
    callback the checkpoint does not know keeps its own); a checkpoint from before callbacks still loads."""
    from cptkit.training.state import TrainState, client_state, restore

    class Part:
        def __init__(self, v: int):
            self.v = v

        def state_dict(self) -> dict:
            return {"v": self.v}

        def load_state_dict(self, s: dict) -> None:
            self.v = s["v"]

    saved = client_state(TrainState(step=3, tokens=96, elapsed=1.0, weight_sum={"a": 1.0}), Part(7),
                         {"mixture": Part(1), "mine": Part(2)})
    state, sampler, cbs = TrainState(), Part(0), {"mixture": Part(0), "mine": Part(0), "new": Part(5)}
    restore(saved, state, sampler, cbs)
    assert (state.step, state.tokens, sampler.v) == (3, 96, 7)
    assert {k: c.v for k, c in cbs.items()} == {"mixture": 1, "mine": 2, "new": 5}
    old = {k: v for k, v in saved.items() if k != "callbacks"} | {"controller": {"v": 9}, "proxy_log": []}
    restore(old, state, sampler, cbs)
    assert cbs["mixture"].v == 9 and cbs["mine"].v == 2
