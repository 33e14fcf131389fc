"""LionW and the inverse-sqrt schedule (domain upsampling, seed 002 Table 1 / §2) against hand-computed steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

from cptkit.core.config import compose_step
from cptkit.training.optim import LionW
from cptkit.training.schedule import make_schedule


def test_lion_two_steps_by_hand():
    # θ0 = (1, −2), lr 0.1, β = (0.9, 0.99), λ = 0.5, m0 = 0
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = LionW([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    # step 1, g = (0.5, −0.1): c = 0.1·g = (0.05, −0.01), sign (1, −1)
    # θ1 = θ0 − 0.1·(sign + 0.5·θ0) = (1 − 0.15, −2 + 0.2) = (0.85, −1.8); m1 = 0.01·g = (0.005, −0.001)
    p.grad = torch.tensor([0.5, -0.1], dtype=torch.float64)
    opt.step()
    assert p.tolist() == pytest.approx([0.85, -1.8], abs=1e-12)
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.005, -0.001], abs=1e-12)
    # step 2, g = (−0.04, −0.1): c = 0.9·m1 + 0.1·g = (0.0045 − 0.004, −0.0009 − 0.01) = (0.0005, −0.0109):
    # sign (1, −1): the momentum wins over the negative gradient in coordinate 0
    # θ2 = (0.85 − 0.1·(1 + 0.425), −1.8 − 0.1·(−1 − 0.9)) = (0.7075, −1.61)
    # m2 = 0.99·m1 + 0.01·g = (0.00495 − 0.0004, −0.00099 − 0.001) = (0.00455, −0.00199)
    p.grad = torch.tensor([-0.04, -0.1], dtype=torch.float64)
    opt.step()
    assert p.tolist() == pytest.approx([0.7075, -1.61], abs=1e-12)
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.00455, -0.00199], abs=1e-12)


def test_rsqrt_schedule_by_hand():
    # peak 1, 100 steps, warmup 4 (from 0), cooldown over the last 20 (linear to 0)
    s = make_schedule(1.0, 100, warmup=4, decay=20, init_lr=0.0, kind="rsqrt")
    assert s.lr(0) == 0.0 and s.lr(2) == pytest.approx(0.5)  # linear warmup 0 → 1
    assert s.lr(4) == pytest.approx(1.0)  # sqrt(4/4)
    assert s.lr(16) == pytest.approx(0.5)  # sqrt(4/16)
    assert s.lr(64) == pytest.approx(0.25)  # sqrt(4/64)
    r80 = math.sqrt(4 / 80)  # 0.22360...: the cooldown starts here
    assert s.lr(80) == pytest.approx(r80)
    assert s.lr(90) == pytest.approx(r80 * 0.5)  # half-way down the 20 cooldown steps
    assert s.lr(99) == pytest.approx(r80 * 1 / 20)
    # without a cooldown: rsqrt to the end; WSD unchanged (constant)
    assert make_schedule(1.0, 100, warmup=4, kind="rsqrt").lr(99) == pytest.approx(math.sqrt(4 / 99))
    assert make_schedule(1.0, 100, warmup=4).lr(99) == 1.0
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_schedule(1.0, 100, kind="cosine")


@pytest.fixture(scope="module")
def stream(corpus_dir, corpus_records, tmp_path_factory):
    base = tmp_path_factory.mktemp("optim")
    tok = make_tokenizer(corpus_records, base / "tok")
    out = base / "stream"
    build_stream(corpus_dir, tok, out, [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=32",
                                        "mix.eval_docs=2"])
    return out


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_train_runs_lion_on_both_engines(stream, tmp_path, engine):
    from transformers import AutoModelForCausalLM

    from cptkit.steps.train import run

    # Lion without weight decay at a constant lr = 2^-7 moves every weight by a whole number of lr's
    # (±lr per step); AdamW's steps after the first are not multiples of lr
    lr = 2.0 ** -7
    out = tmp_path / engine
    run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", "model.hidden=32",
                               "model.layers=1", "model.heads=2", "train.micro_batch=4", "train.threads=1",
                               "quiet=true", f"train.engine={engine}", "train.precision=fp32",
                               "train.optimizer=lion", f"train.lr={lr}", "train.warmup=0", "train.weight_decay=0",
                               "train.max_steps=3", "train.save_initial=true", "train.grad_clip=1e9"]))
    extra = json.loads((out / "_manifest.json").read_text())["extra"]
    assert extra["optimizer"] == "lion" and extra["engine"] == engine
    before = AutoModelForCausalLM.from_pretrained(Path(out) / "model_init").state_dict()
    after = AutoModelForCausalLM.from_pretrained(Path(out) / "model").state_dict()
    steps = torch.cat([((after[k] - before[k]) / lr).flatten() for k in before if before[k].is_floating_point()])
    assert steps.abs().max() > 0.5  # it trained
    assert (steps - steps.round()).abs().max() < 1e-2
    assert steps.abs().max() <= 3 + 1e-2


def test_bad_optimizer_or_schedule_is_refused():
    import cptkit.steps.train  # noqa: F401 - registers the train step's schema
    from cptkit.core.errors import CptkitError

    for bad in ("train.optimizer=sgd", "train.schedule=cosine"):
        with pytest.raises(CptkitError, match=bad.split("=")[0]):
            compose_step("train", ["io.inputs=['x']", "io.output='y'", bad])


def test_deepspeed_config_leaves_the_optimizer_to_lion():
    from cptkit.core.errors import CptkitError
    from cptkit.training.engine import deepspeed_config

    kw = {"micro_batch": 2, "grad_accum": 1, "world": 1, "lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8,
          "weight_decay": 0.1, "grad_clip": 1.0, "precision": "fp32", "zero_stage": 2}
    cfg = deepspeed_config({}, optimizer="lion", **kw)
    assert "optimizer" not in cfg and cfg["zero_allow_untested_optimizer"] is True  # LionW goes in as a client
    assert deepspeed_config({}, **kw)["optimizer"]["type"] == "AdamW"
    with pytest.raises(CptkitError, match="contradicts train.optimizer=lion"):
        deepspeed_config({}, optimizer="lion", user={"optimizer": {"type": "AdamW"}}, **kw)


def test_the_schedule_is_the_one_source_of_the_learning_rate():
    """train.lr reaches the optimizer only through the schedule; a DeepSpeed file that sets another
    peak is refused in one line naming the file and key; a file's own scheduler takes over."""
    from cptkit.core.errors import CptkitError
    from cptkit.training.engine import TorchEngine, lr_source, param_groups

    sched = make_schedule(3e-3, 10, warmup=2, init_lr=1e-7)
    assert lr_source({}, None, sched) == "cptkit"
    assert lr_source({"optimizer": {"params": {"lr": 3e-3}}}, "ds.json", sched) == "cptkit"  # agrees: fine
    with pytest.raises(CptkitError, match=r"^ds.json: optimizer.params.lr=0.002 disagrees with train.lr=0.003"):
        lr_source({"optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}}, "ds.json", sched)
    assert lr_source({"optimizer": {"params": {"lr": 2e-3}}, "scheduler": {"type": "WarmupLR"}}, "ds.json",
                     sched) == "deepspeed (user file)"
    model = torch.nn.Linear(4, 4)
    eng = TorchEngine(model, param_groups(model, 0.1), schedule=sched, betas=(0.9, 0.95), eps=1e-8,
                      grad_clip=1.0, precision="fp32", grad_accum=1)
    lrs = []
    for _ in range(3):
        lrs.append(eng.get_lr()[0])
        eng(input=torch.ones(1, 4)).sum().backward()
        eng.step()
    assert lrs == pytest.approx([sched.lr(0), sched.lr(1), sched.lr(2)]) and lrs[0] == pytest.approx(1e-7)
