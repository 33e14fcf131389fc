"""train: train a causal LM on a build-mix stream with DeepSpeed (ZeRO-2, bf16) and a static,
staged or dynamic domain mixture (SPEC §9): train.mixture=static|staged|topic_ppl|velocitune|dbl.

Any transformers causal LM (``model=hf model.path=DIR|FILE.gguf|smollm2``) or a tiny random
Llama (``model=tiny_llama``); DeepSpeed ZeRO (stage 2 by default, ``conf/deepspeed/``), bf16,
AdamW β = (0.9, 0.95), weight decay, gradient clipping, gradient checkpointing, SDPA; a
Warmup-Stable-Decay LR schedule; mixture controllers chosen by ``train.mixture``.

Outputs under ``--out``: ``metrics.jsonl`` (one line per step: loss, LR, tokens/s, weights),
``weights.jsonl`` and ``weights.png`` (the weight trajectory), ``avg_weights.json`` and
``mix_reweighted.yaml`` (the time-averaged weights as a static mixture), ``checkpoints/``
(DeepSpeed checkpoints with data position, mixture state and RNG), ``model/`` (the final
model and tokenizer, ``from_pretrained``-loadable), ``_velocitune_targets.json`` (proxy mode).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from cptkit.core.config import JobConfig, check, redact
from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.core.run import Run
from cptkit.core.shards import atomic_write_bytes, atomic_write_json
from cptkit.core.step import IN, OUT, QUIET, step


@dataclass
class ModelConfig:
    name: str = "tiny_llama"  # tiny_llama (random, seeded) | hf (model.path)
    path: str | None = None  # HF directory, .gguf file or smollm2 (name=hf)
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None
    intermediate: int | None = None
    max_position: int = 0  # 0: the stream's seq_len
    seed: int = 0
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 (GPU)

    def __post_init__(self) -> None:
        check(self.name in ("tiny_llama", "hf"), "name", self.name, "use tiny_llama or hf")
        for key in ("hidden", "layers", "heads"):
            check(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        check(self.hidden % self.heads == 0, "heads", self.heads, f"must divide model.hidden={self.hidden}")
        kv = self.kv_heads
        check(kv is None or (kv >= 1 and self.heads % kv == 0), "kv_heads", kv,
              f"must be >= 1 and divide model.heads={self.heads}")
        check(self.intermediate is None or self.intermediate >= 1, "intermediate", self.intermediate, "must be >= 1")
        check(self.max_position >= 0, "max_position", self.max_position, "must be >= 0 (0: the stream's seq_len)")


@dataclass
class TopicPPLConfig:
    round_tokens: float = 1e5  # R: tokens per adjustment round
    round_fraction: float | None = None  # R as a share of the run's tokens (overrides round_tokens); paper 40B/100B
    alpha: float = 0.4
    within_parent: bool = True  # adjust topics within their parent (language), keeping its share

    def __post_init__(self) -> None:
        frac = self.round_fraction
        check(frac is None or 0 < frac <= 1, "round_fraction", frac, "must be in (0, 1]")


@dataclass
class VelocituneConfig:
    interval_steps: int = 150  # m
    use_target: bool = True  # false: the ablation V = l_t / l_init
    learnt_guard: bool = False  # true: l_init <= l_target counts as learnt (V = 0) instead of Algorithm 1's ratio
    targets: Any = None  # target loss per domain {domain: loss}
    targets_file: str | None = None  # _velocitune_targets.json of a proxy run
    allow_budget_mismatch: bool = False  # use targets extrapolated to another token budget than this run's
    allow_unconverged: bool = False  # use targets whose proxy stopped at proxy_fraction before converging
    init_eval_docs: int = 0  # held-out docs per domain for l_init and the proxy's checkpoints (0: all)
    eval_docs: int | None = None  # the subset S' per domain for velocities (null: train.eval_docs)
    proxy: bool = False  # run the proxy: token-share weights, checkpoints until the targets settle, write targets
    proxy_fraction: float = 0.6  # the most of the real run's steps the proxy may train
    proxy_every: float = 0.05  # a checkpoint every this share of the real run's steps (or steps, if >= 1)
    proxy_min_checkpoints: int = 4
    sigma: float = 0.01  # stop when the predicted targets move less than this between checkpoint sets (App. B)


@dataclass
class DBLConfig:
    interval_steps: int = 150
    eta: float = 1.0
    smoothing: float = 1e-4
    clip: bool = True


@dataclass
class TrainOptions:
    mixture: str = "static"  # static | staged | topic_ppl | velocitune | dbl | package.module:Class (a Controller)
    weights: Any = None  # static: null/stages (each stage's weights in turn), or one mixture: {domain: w}, tokens, uniform
    init_weights: Any = None  # dynamic start in each stage: {domain: w}, uniform, stage, tokens; null: per method
    controller_stages: Any = None  # stages a dynamic mixture acts in (null: all); the others keep their static weights
    micro_batch: int = 4
    grad_accum: int = 1
    budget_tokens: float = 0.0  # 0: the stream's planned tokens
    max_steps: int = 0  # 0: from the budget
    lr: float = 1e-4  # peak
    init_lr: float = 1e-7
    warmup: float = 0.05  # steps (≥ 1) or fraction (< 1)
    decay: float = 0.0  # steps or fraction at the end; 0: constant after warmup
    decay_type: str = "linear"  # linear | cosine | 1-sqrt | exponential
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "auto"  # auto (bf16 on GPU or a CPU with native bf16, else fp32) | bf16 | fp32 | fp16 (GPU)
    engine: str = "auto"  # auto (DeepSpeed on GPU / >1 process / ZeRO-3 / a DeepSpeed file; else torch) | deepspeed | torch
    zero_stage: int | None = None  # null: the deepspeed group's stage (deepspeed=zero1|zero2|zero3)
    gradient_checkpointing: Any = "auto"  # auto (on for models of ≥ 1e8 parameters) | true | false
    deepspeed_config: str | None = None  # a JSON/YAML DeepSpeed file; its stage/optimizer/scheduler win
    save_every: int = 0  # optimizer steps between checkpoints (0: only at the end)
    keep_last: int = 2
    resume: bool = False
    save_initial: bool = False  # also save the model before training as OUT/model_init (HF format)
    eval_docs: int = 8  # held-out docs per domain used for eval losses
    eval_max_tokens: int = 256
    eval_every: int = 0  # per-domain eval losses every N steps, before step 1 and after the last (0: off)
    eval_tasks: list[str] = field(default_factory=list)  # few-shot tasks (conf/eval/tasks) at every eval point
    eval_tasks_limit: int = 50  # first N items per task (0: all)
    eval_tasks_shots: int | None = 0  # null: the task's default
    threads: int = 0  # torch CPU threads (0: torch's default)
    plot: bool = True
    tensorboard: bool = True  # OUT/tensorboard: loss, LR, tokens/s, weights, per-domain eval losses
    wandb: Any = "auto"  # auto: log to W&B when wandb is installed and WANDB_PROJECT/WANDB_MODE/WANDB_API_KEY is set
    log_every: int = 0  # progress lines when stderr is not a terminal (0: every ~10% of the steps)
    backend: str = "auto"  # gloo on CPU, nccl on GPU
    topic_ppl: TopicPPLConfig = field(default_factory=TopicPPLConfig)
    velocitune: VelocituneConfig = field(default_factory=VelocituneConfig)
    dbl: DBLConfig = field(default_factory=DBLConfig)

    def __post_init__(self) -> None:
        """Refuse invalid ``train.*`` values with one line each, before anything is written."""
        from cptkit.mixtures.controller import MIXTURES
        from cptkit.training.schedule import DECAY_TYPES

        check(self.mixture in MIXTURES or ":" in self.mixture, "mixture", self.mixture,
              f"use one of {', '.join(MIXTURES)} or package.module:Class")
        for key, lo in (("micro_batch", 1), ("grad_accum", 1), ("max_steps", 0), ("save_every", 0), ("keep_last", 0),
                        ("threads", 0), ("eval_docs", 0), ("eval_max_tokens", 1), ("eval_every", 0), ("log_every", 0)):
            v = getattr(self, key)
            check(v >= lo, key, v, f"must be ≥ {lo}")
        for key in ("budget_tokens", "init_lr", "weight_decay", "grad_clip", "warmup", "decay"):
            v = getattr(self, key)
            check(v >= 0 and not math.isinf(v), key, v, "must be a finite number ≥ 0")
        check(self.lr > 0 and not math.isinf(self.lr), "lr", self.lr, "must be > 0")
        check(self.eps > 0, "eps", self.eps, "must be > 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        check(self.decay_type in DECAY_TYPES, "decay_type", self.decay_type, f"use one of {', '.join(DECAY_TYPES)}")
        check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "betas", self.betas,
              "two values in [0, 1)")
        check(self.precision in ("auto", "bf16", "fp32", "fp16"), "precision", self.precision,
              "use auto, bf16, fp32 or fp16 (GPU)")
        check(self.engine in ("auto", "deepspeed", "torch"), "engine", self.engine, "use auto, deepspeed or torch")
        check(self.zero_stage is None or self.zero_stage in (0, 1, 2, 3), "zero_stage", self.zero_stage,
              "use 0, 1, 2 or 3 (or null: the deepspeed group's)")
        check(str(self.gradient_checkpointing).lower() in ("auto", "true", "false"), "gradient_checkpointing",
              self.gradient_checkpointing, "use auto, true or false")  # Any: a bool or auto


@dataclass
class TrainJob(JobConfig):
    tokenizer: str | None = None  # default: the stream's tokenizer
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainOptions = field(default_factory=TrainOptions)
    deepspeed: Any = field(default_factory=dict)




def run_identity(config: dict) -> str:
    """The hash that names a run in its output: its config without ``train.resume`` and ``train.max_steps``
    (a finished run can be extended to more steps: same run, longer)."""
    from cptkit.core.job import config_hash

    train = {k: v for k, v in config.get("train", {}).items() if k not in ("resume", "max_steps")}
    return config_hash({**config, "train": train})


def reopen_finished(out: Path, ckdir: Path, max_steps: int, resume: bool) -> bool:
    """A finished run asked for another ``max_steps``: reopen it to extend (resume, more steps) or refuse.

    Returns True when the run is to be extended: it resumes from its final checkpoint, and its
    ``_SUCCESS`` is removed once that checkpoint has loaded."""
    from cptkit.core.job import MANIFEST, SUCCESS
    from cptkit.training.checkpoint import latest_tag, tag_step

    if not (out / SUCCESS).exists() or max_steps <= 0 or not (out / MANIFEST).exists():
        return False
    try:
        done = int(json.loads((out / MANIFEST).read_text())["extra"]["steps"])
    except (ValueError, KeyError, TypeError):
        return False
    if max_steps == done:
        return False
    if max_steps < done:
        raise CptkitError(f"{out}: finished at step {done}; train.max_steps={max_steps} would shorten it "
                          "(io.overwrite=true starts over)")
    if not resume:
        raise CptkitError(f"{out}: finished at step {done}; pass train.resume=true to extend it to "
                          f"train.max_steps={max_steps}, or io.overwrite=true to start over")
    tag = latest_tag(ckdir)
    if tag is None or tag_step(tag) != done:
        raise CptkitError(f"{out}: finished at step {done} but {ckdir} holds no checkpoint of that step to extend")
    log.info("extending %s from step %d to %d", out, done, max_steps)
    return True


# --- pieces ---------------------------------------------------------------------------------
def build_model(mcfg: ModelConfig, tokenizer, seq_len: int):
    from cptkit.models import lm

    if mcfg.name == "tiny_llama":
        model = lm.tiny_llama(tokenizer, hidden=mcfg.hidden, layers=mcfg.layers, heads=mcfg.heads,
                              intermediate=mcfg.intermediate, max_position=mcfg.max_position or seq_len,
                              seed=mcfg.seed, kv_heads=mcfg.kv_heads)
    else:  # hf (ModelConfig allows no other name)
        if not mcfg.path:
            raise CptkitError("model=hf needs model.path (an HF directory, a .gguf file or smollm2)")
        from cptkit.models.pretrained import load_pretrained

        model = load_pretrained(mcfg.path)  # a GGUF file is dequantized into a plain, saveable model
    try:
        model.set_attn_implementation(mcfg.attn_implementation)
    except (AttributeError, ValueError, ImportError) as e:
        log.warning("attention %s unavailable (%s); using the model's default", mcfg.attn_implementation, e)
    model.config.use_cache = False
    return model


def resolve_weights(spec: Any, stream, default: str, stage: Any = None) -> dict[str, float]:
    """Weights from config: a mapping, or uniform / tokens / stage (``stream``: the same).

    With a ``stage`` (a :class:`~cptkit.training.stages.RunStage`), ``uniform`` and ``tokens``
    are over the stage's domains and ``stage`` is its weights; without one, over all domains
    and ``stage`` is the stream's first stage.
    """
    spec = default if spec is None else spec
    doms = stage.domains if stage is not None else list(stream.domains)
    if isinstance(spec, str):
        if spec == "uniform":
            return {d: (1.0 / len(doms) if d in doms else 0.0) for d in stream.domains}
        if spec in ("stage", "stream", "stages"):
            return dict(stage.weights) if stage is not None else stream.stage_weights(0)
        if spec == "tokens":
            tw = stream.token_weights()
            return {d: (tw[d] if d in doms else 0.0) for d in stream.domains}
        raise CptkitError(f"weights {spec!r}: give a mapping or one of uniform, stage, tokens")
    w = dict(spec)
    unknown = [k for k in w if k not in stream.index]
    if unknown:
        raise CptkitError(f"weights: unknown domain {unknown[0]!r}; the stream has {', '.join(stream.domains)}")
    return {d: float(w.get(d, 0.0)) for d in stream.domains}


def load_targets(vcfg: VelocituneConfig, budget_tokens: float = 0.0, domains: list[str] | None = None) -> dict[str, float]:
    """Velocitune/DBL targets: ``targets`` over a proxy's ``targets_file`` (checked against this run)."""
    from cptkit.mixtures.velocitune import load_targets_file

    targets = {str(k): float(v) for k, v in (vcfg.targets or {}).items()}  # targets: Any, as written
    if vcfg.targets_file:
        from_file = load_targets_file(vcfg.targets_file, budget_tokens, [] if targets else list(domains or []),
                                      vcfg.allow_budget_mismatch, vcfg.allow_unconverged)
        targets = {**from_file, **targets}
    return targets


def make_controller(tcfg: TrainOptions, stream, proxy: bool, run_sequences: int | None = None,
                    budget_tokens: float = 0.0):
    """The run's mixture: the stream's stages in order, a dynamic controller acting within them.

    ``static`` follows the stages with their weights (``train.weights`` = a mapping, ``tokens`` or
    ``uniform`` gives one mixture for the whole run instead); ``staged`` follows the plan row by
    row; ``topic_ppl``/``velocitune``/``dbl`` act in ``train.controller_stages`` (default all),
    restarting in each from ``train.init_weights`` over the stage's domains. The proxy of
    Velocitune trains with token-share weights (``init_weights``) throughout.
    """
    from cptkit.mixtures import controller as mx
    from cptkit.training.stages import RunStage, StageMixture, run_stages

    kind = "static" if proxy else tcfg.mixture  # one of mx.MIXTURES (TrainOptions)
    total = int(stream.meta["total_sequences"])
    n_run = run_sequences or total
    doms = list(stream.domains)

    def whole(weights: dict[str, float], name: str) -> list[RunStage]:
        bad = [d for d, w in weights.items() if not w >= 0]
        if bad:
            raise CptkitError(f"train.weights: weight of {bad[0]!r} is {weights[bad[0]]}; weights must be >= 0")
        tot = sum(weights.values())
        if tot <= 0:
            raise CptkitError("train.weights put no mass on any domain")
        return [RunStage(name, 0, n_run, {d: w / tot for d, w in weights.items()})]

    if proxy:
        return StageMixture(whole(resolve_weights(tcfg.init_weights, stream, "tokens"), "proxy"))
    if kind == "static":
        if tcfg.weights is None or tcfg.weights in ("stages", "stream"):
            return StageMixture(run_stages(stream.meta["stages"], doms, total, n_run))
        return StageMixture(whole(resolve_weights(tcfg.weights, stream, "stage"), "all"))
    stages = run_stages(stream.meta["stages"], doms, total, n_run)
    if kind == "staged":
        return StageMixture(stages, exact_plan=True)
    cs = [str(x) for x in tcfg.controller_stages] if tcfg.controller_stages is not None else None  # Any: as written
    default_init = "uniform" if kind == "velocitune" else "stage"
    first = dict.fromkeys(doms, 1.0)  # placeholder: entering a stage it acts in sets the start weights
    if ":" in kind:
        ctl: Any = mx.plugin_controller(kind)(doms, first)
    elif kind == "topic_ppl":
        tp = tcfg.topic_ppl
        round_tokens = tp.round_fraction * budget_tokens if tp.round_fraction is not None else tp.round_tokens
        ctl = mx.TopicPPL(doms, first, stream.parents, round_tokens, tp.alpha, tp.within_parent)
    else:
        vcfg = tcfg.velocitune
        targets = load_targets(vcfg, budget_tokens, doms)
        if kind == "velocitune":
            ctl = mx.Velocitune(doms, first, targets, vcfg.interval_steps, vcfg.use_target, vcfg.learnt_guard,
                                vcfg.init_eval_docs, vcfg.eval_docs)
        else:
            ctl = mx.DBL(doms, first, targets, tcfg.dbl.interval_steps, tcfg.dbl.eta, tcfg.dbl.smoothing,
                         tcfg.dbl.clip)
    return StageMixture(stages, ctl, cs, lambda st: resolve_weights(tcfg.init_weights, stream, default_init, st))


def plot_weights(path: Path, out: Path) -> str | None:
    """Plot the weight trajectory (JSONL) as a PNG; returns a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: weights.png skipped (pip install matplotlib)"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    from cptkit.training.runlog import save_figure

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for d in rows[0]["weights"]:
        ax.plot([r["tokens"] for r in rows], [r["weights"][d] for r in rows], drawstyle="steps-post", label=d)
    ax.set_xlabel("tokens")
    ax.set_ylabel("domain weight")
    save_figure(fig, out)
    return None


def _truncate_jsonl(path: Path, max_step: int) -> None:
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= max_step]
    atomic_write_bytes(path, ("\n".join(keep) + "\n").encode() if keep else b"")


def _rng_state() -> dict[str, Any]:
    """torch/python/numpy RNG states as tensors, numbers and lists (``weights_only`` loadable)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [str(name), torch.from_numpy(np.asarray(key, dtype=np.int64)), int(pos), int(has_gauss),
                      float(gauss)]}


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    name, key, pos, has_gauss, gauss = s["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))


# --- the step -------------------------------------------------------------------------------
@step("train", TrainJob, options=(IN, OUT, QUIET))
def run(conf: TrainJob, ctx: Run) -> dict:
    from cptkit.core.job import Job, Task
    from cptkit.mixtures.stream import Stream
    from cptkit.training.engine import init_distributed

    tcfg = conf.train
    if len(conf.io.inputs) != 1:
        raise CptkitError("train: pass exactly one --in: a build-mix stream directory")
    if conf.io.output in (None, "-"):
        raise CptkitError("train: pass --out DIR for checkpoints, metrics and the final model")
    stream = Stream(conf.io.inputs[0])
    proxy = tcfg.velocitune.proxy
    resume = tcfg.resume
    ctx = ctx.recording("train.resume", False)  # resuming does not change what the run computes
    if tcfg.threads > 0:
        torch.set_num_threads(tcfg.threads)

    rank, world = init_distributed(tcfg.backend)
    out = Path(conf.io.output)  # type: ignore[arg-type]  # not None: checked above
    ckdir = out / "checkpoints"
    job = None
    if rank == 0:
        job = Job(ctx, tasks=[Task(0, [], name="train")], needs_inputs=False)
        job.hash = run_identity(job.config)
        extend = reopen_finished(out, ckdir, tcfg.max_steps, resume)
        job.__enter__()
        job.already_done = job.already_done and not extend
    torch.distributed.barrier()
    try:
        result = _train(RunSpec(conf, stream, proxy, resume, rank, world, out, job))
    except BaseException as e:
        if job is not None:
            job.__exit__(type(e), e, e.__traceback__)
        raise
    if job is not None:
        job.__exit__(None, None, None)
    return result


@dataclass
class RunSpec:
    """What this process trains, where, and as which rank (resolved once by :func:`run`)."""

    conf: TrainJob  # the typed config (``train.resume`` as given; ``resume`` below)
    stream: Any
    proxy: bool
    resume: bool
    rank: int
    world: int
    out: Path
    job: Any  # the Job on rank 0, None elsewhere

    @property
    def tcfg(self) -> TrainOptions:
        return self.conf.train

    @property
    def seq_len(self) -> int:
        return int(self.stream.seq_len)

    @property
    def ckdir(self) -> Path:
        return self.out / "checkpoints"


@dataclass
class TrainState:
    """Where the run is: saved in every checkpoint with the sampler, controller and RNG states."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    weight_sum: dict[str, float] = field(default_factory=dict)
    proxy_log: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def state_dict(self, sampler: Any, controller: Any) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "elapsed": self.elapsed, "weight_sum": self.weight_sum,
                "sampler": sampler.state_dict(), "controller": controller.state_dict(), "rng": _rng_state(),
                "proxy_log": self.proxy_log}

    def load_state_dict(self, state: dict[str, Any], sampler: Any, controller: Any) -> None:
        self.step, self.tokens, self.elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
        self.weight_sum = state["weight_sum"]
        self.proxy_log = [tuple(x) for x in state.get("proxy_log", [])]  # type: ignore[misc]
        sampler.load_state_dict(state["sampler"])
        controller.load_state_dict(state["controller"])
        _set_rng_state(state["rng"])


class Checkpointer:
    """Engine checkpoints under ``OUT/checkpoints`` (the last ``train.keep_last`` kept)."""

    def __init__(self, engine: Any, spec: RunSpec):
        self.engine, self.dir, self.rank, self.keep = engine, spec.ckdir, spec.rank, spec.tcfg.keep_last

    def save(self, state: TrainState, sampler: Any, controller: Any) -> None:
        from cptkit.training.checkpoint import prune, tag_for

        self.engine.save_checkpoint(str(self.dir), tag=tag_for(state.step),
                                    client_state=state.state_dict(sampler, controller))
        if self.rank == 0:
            prune(self.dir, self.keep)

    def load(self, engine_name: str) -> tuple[str, dict[str, Any]]:
        """The latest checkpoint's path and client state (after checking it fits this engine)."""
        from cptkit.training.checkpoint import check_resumable

        check_resumable(self.dir, engine_name)
        path, state = self.engine.load_checkpoint(str(self.dir))
        if path is None:
            raise CptkitError(f"{self.dir}: cannot load the latest checkpoint")
        return path, state


class MetricsLog:
    """``metrics.jsonl`` (a line per step and per eval point) and ``weights.jsonl`` (the mixture
    weights at init, each stage and update, and the end), written by rank 0; plus the RunLog
    (TensorBoard, progress)."""

    FILES = ("metrics.jsonl", "weights.jsonl")

    def __init__(self, spec: RunSpec, runlog: Any, resumed_at: int | None):
        self.runlog = runlog
        self.metrics = self.weights = None
        if spec.rank != 0:
            return
        for name in self.FILES:  # a resumed run drops what came after its checkpoint
            if resumed_at is None:
                (spec.out / name).unlink(missing_ok=True)
            else:
                _truncate_jsonl(spec.out / name, resumed_at)
        self.metrics = open(spec.out / "metrics.jsonl", "a")  # noqa: SIM115
        self.weights = open(spec.out / "weights.jsonl", "a")  # noqa: SIM115

    def weights_event(self, state: TrainState, weights: Any, info: dict[str, Any]) -> None:
        if self.weights is not None:
            self.weights.write(json.dumps({"step": state.step, "tokens": state.tokens, "weights": weights, **info}) + "\n")
            self.weights.flush()

    def step(self, step: int, rec: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()
            self.runlog.step(step, rec)

    def eval_point(self, state: TrainState, point: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps({"step": state.step, "tokens": state.tokens, "event": "eval", **point,
                                           "eval_tokens": state.tokens}) + "\n")
            self.runlog.scalars(state.step, point)

    def close(self, state: TrainState, last_weights: dict[str, float] | None) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.weights is not None:
            if last_weights is not None:  # the weights in force at the end: a static run's trajectory is a line
                self.weights.write(json.dumps({"step": state.step, "tokens": state.tokens, "event": "end",
                                               "weights": {d: round(v, 6) for d, v in last_weights.items()}}) + "\n")
            self.weights.close()
        self.runlog.close()


def prepare_checkpoints(spec: RunSpec) -> bool:
    """Whether there is a checkpoint to resume from; refuses to mix a new run into an old one."""
    has_ckpt = (spec.ckdir / "latest").exists()
    if has_ckpt and not spec.resume and spec.conf.io.overwrite:  # start over, as the error below suggests
        if spec.rank == 0:
            shutil.rmtree(spec.ckdir)
        has_ckpt = False
    if has_ckpt and not spec.resume:
        raise CptkitError(f"{spec.out}: holds checkpoints of an unfinished run; pass train.resume=true to continue "
                          "it or io.overwrite=true to start over")
    if spec.resume and not has_ckpt:
        log.warning("train.resume=true but %s has no checkpoint: starting from step 0", spec.ckdir)
    return has_ckpt


def write_outputs(spec: RunSpec, engine: Any, tokenizer: Any, state: TrainState, proxy_run: Any,
                  extra: dict[str, Any]) -> None:
    """Rank 0's end of run: time-averaged weights (and as a recipe), plots, the proxy's targets, the model."""
    from cptkit.mixtures.rules import normalize
    from cptkit.training.engine import full_state_dict
    from cptkit.training.metrics import plot_curves
    from cptkit.training.runlog import plot_loss

    out, tcfg = spec.out, spec.tcfg
    final_sd = full_state_dict(engine)  # ZeRO-3: gathered from every rank (collective); else None
    if spec.rank != 0:
        return
    avg = normalize(state.weight_sum) if sum(state.weight_sum.values()) > 0 else {}
    atomic_write_json(out / "avg_weights.json", {"weights": avg, "steps": state.step})
    recipe = {"name": f"reweighted_{out.name}", "stages": [{"name": "reweighted", "weights": avg}]}
    atomic_write_bytes(out / "mix_reweighted.yaml",
                       ("# time-averaged weights of this run; use: train.mixture=static "
                        "train.weights=<these weights>, or as a mix stage\n"
                        + OmegaConf.to_yaml(OmegaConf.create(recipe))).encode())
    plots = []
    if tcfg.plot and (out / "weights.jsonl").exists():
        plots.append(lambda: plot_weights(out / "weights.jsonl", out / "weights.png"))
    if tcfg.plot:
        plots.append(lambda: plot_loss(out / "metrics.jsonl", out / "loss.png"))
    if tcfg.plot and tcfg.eval_every:
        plots.append(lambda: plot_curves(out, out / "curves.png"))
    for plot in plots:
        note = plot()
        if note:
            log.warning(note)
    if proxy_run is not None:
        res = proxy_run.result(spec.stream.domains, str(spec.stream.path), state.step)
        atomic_write_json(out / "_velocitune_targets.json", res)
        if not res["converged"]:
            log.warning("velocitune proxy: stopped at proxy_fraction (%d steps) with the targets still moving "
                        "by %.4g (>= sigma %.4g): a run using them needs train.velocitune.allow_unconverged=true",
                        state.step, res["change"] if res["change"] is not None else float("inf"), res["sigma"])
        extra["velocitune targets"] = json.dumps({d: round(v, 4) for d, v in res["targets"].items()})
        extra["velocitune proxy steps"] = state.step
    model_dir, tmp = out / "model", out / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    engine.module.save_pretrained(str(tmp), state_dict=final_sd)
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp, model_dir)


def _train(spec: RunSpec) -> dict:
    from cptkit.core.job import TaskResult
    from cptkit.mixtures.controller import domain_losses
    from cptkit.mixtures.stream import Sampler
    from cptkit.models.lm import load_tokenizer
    from cptkit.training.engine import make_engine
    from cptkit.training.metrics import evaluate_point, load_eval_tasks
    from cptkit.training.runlog import RunLog
    from cptkit.training.schedule import make_schedule
    from cptkit.training.stages import draw_batch

    conf, tcfg, stream, seq_len = spec.conf, spec.tcfg, spec.stream, spec.seq_len
    rank, world, out, job = spec.rank, spec.world, spec.out, spec.job
    if job is not None and job.already_done:
        return job.finish()
    has_ckpt = prepare_checkpoints(spec)
    tok_spec = conf.tokenizer or stream.tokenizer_spec()
    tokenizer = load_tokenizer(tok_spec)
    if len(tokenizer) < int(stream.meta["vocab_size"]):
        raise CptkitError(f"tokenizer {tok_spec} has {len(tokenizer)} tokens, the stream was built with "
                          f"{stream.meta['vocab_size']}")

    micro, accum = tcfg.micro_batch, tcfg.grad_accum
    global_seqs = micro * accum * world
    budget = tcfg.budget_tokens or float(stream.meta["total_sequences"] * seq_len)
    total_steps = tcfg.max_steps or max(1, math.ceil(budget / (global_seqs * seq_len)))
    full_budget = total_steps * global_seqs * seq_len
    try:
        schedule = make_schedule(tcfg.lr, total_steps, warmup=tcfg.warmup, decay=tcfg.decay, init_lr=tcfg.init_lr,
                                 decay_type=tcfg.decay_type, min_lr_ratio=tcfg.min_lr_ratio)
    except ValueError as e:
        raise CptkitError(f"train schedule ({total_steps} steps): {e}") from None
    controller = make_controller(tcfg, stream, spec.proxy, total_steps * global_seqs, full_budget)
    proxy_run = None
    if spec.proxy:  # the proxy follows the real run's schedule and stops early (Velocitune App. B)
        from cptkit.mixtures.velocitune import ProxyRun

        proxy_run = ProxyRun(tcfg.velocitune, total_steps, global_seqs * seq_len)
        total_steps = proxy_run.max_steps
    eval_recs = stream.eval_records()
    needs_eval = controller.dynamic or spec.proxy or tcfg.eval_every > 0
    eval_tasks = load_eval_tasks(tcfg.eval_tasks) if tcfg.eval_every and tcfg.eval_tasks else []
    if needs_eval:
        have = {r["domain"] for r in eval_recs}
        missing = [d for d in stream.domains if d not in have]
        if missing:
            raise CptkitError(f"{stream.path}: no held-out eval documents for domain {missing[0]!r} "
                              "(rebuild the stream with mix.eval_docs > 0)")

    torch.manual_seed(conf.seed)
    model = build_model(conf.model, tokenizer, seq_len)
    if model.get_input_embeddings().num_embeddings < int(stream.meta["vocab_size"]):
        raise CptkitError(f"model has {model.get_input_embeddings().num_embeddings} embeddings, fewer than the "
                          f"stream's vocabulary ({stream.meta['vocab_size']})")
    if tcfg.save_initial and rank == 0 and not (out / "model_init").exists():
        # The "base" of a from-scratch demo run, for evaluate-compare against the trained model.
        tmp = out / ".model_init.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, out / "model_init")
    engine, engine_info = make_engine(model, tcfg, deepspeed_base=conf.deepspeed or {}, world=world,
                                      schedule=schedule)
    sampler = Sampler(stream, conf.seed)
    checkpointer = Checkpointer(engine, spec)

    state = TrainState(weight_sum=dict.fromkeys(stream.domains, 0.0))
    resumed_at = None
    if spec.resume and has_ckpt:
        path, saved = checkpointer.load(engine_info["engine"])
        state.load_state_dict(saved, sampler, controller)
        resumed_at = state.step
        if rank == 0:
            (out / "_SUCCESS").unlink(missing_ok=True)  # extending a finished run: unfinished until it ends
            log.info("resumed from %s at step %d (%d tokens)", path, state.step, state.tokens)
    for t_ck, l_ck in state.proxy_log if proxy_run is not None else []:
        proxy_run.add(t_ck, l_ck)

    mlog = MetricsLog(spec, RunLog(out, tcfg, job, total_steps, state.step,
                                   redact(job.config) if job is not None else None), resumed_at)
    if state.step == 0 and controller.weights is not None:
        mlog.weights_event(state, controller.weights, {"event": "init"})
    loss_hist: list[float] = []
    w_now: dict[str, float] | None = None
    data_s = mix_s = 0.0
    t_run = time.time()
    while state.step < total_steps:
        t0, c0 = time.time(), time.process_time()
        info: dict[str, Any] = {}
        entered = controller.begin_step(sampler.position)  # a stage starting with this step
        if entered:
            mlog.weights_event(state, controller.weights, {"event": "stage", "stage": entered})
        if controller.dynamic and controller.wants_eval(state.step, state.tokens):
            te = time.time()
            losses = domain_losses(engine.module, tokenizer, eval_recs,
                                   controller.eval_docs(state.step, tcfg.eval_docs), tcfg.eval_max_tokens, seq_len)
            upd = controller.update(state.step, state.tokens, losses)
            info = {"eval_loss": losses, **upd}
            mlog.weights_event(state, controller.weights, {"event": "update", **info})
            mix_s += time.time() - te
        elif tcfg.eval_every and state.step % tcfg.eval_every == 0:
            info = {**evaluate_point(engine.module, tokenizer, eval_recs, tcfg, seq_len, eval_tasks),
                    "eval_tokens": state.tokens}
        td = time.time()
        pairs, mix_info = draw_batch(controller, sampler, global_seqs, stream.domains,
                                     lambda name: mlog.weights_event(state, controller.weights,
                                                                     {"event": "stage", "stage": name}))
        data = sampler.batch(pairs)
        data_s += time.time() - td
        lr_used = float(engine.get_lr()[0])  # this step's LR (cptkit's schedule or a user DeepSpeed scheduler)
        loss = optimizer_step(engine, data, micro, accum, rank, world)
        state.step += 1
        state.tokens += global_seqs * seq_len
        w_now = mix_info.pop("weights_used")
        for d in stream.domains:
            state.weight_sum[d] += w_now[d]
        dt, dc = time.time() - t0, time.process_time() - c0
        state.elapsed += dt
        loss_hist.append(loss)
        mlog.step(state.step, {"step": state.step, "tokens": state.tokens, "loss": loss, "lr": lr_used,
                               "tokens_per_s": global_seqs * seq_len / dt if dt > 0 else 0.0, "seconds": dt,
                               "cpu_seconds": dc, "weights": {d: round(v, 6) for d, v in w_now.items()},
                               **mix_info, **info})
        if proxy_run is not None and proxy_run.is_checkpoint(state.step):
            losses = domain_losses(engine.module, tokenizer, eval_recs, proxy_run.eval_docs, tcfg.eval_max_tokens,
                                   seq_len)
            state.proxy_log.append((float(state.tokens), losses))
            if proxy_run.add(state.tokens, losses):
                total_steps = state.step  # the targets settled: stop the proxy here
        if (tcfg.save_every and state.step % tcfg.save_every == 0) or state.step == total_steps:
            checkpointer.save(state, sampler, controller)
    run_s = time.time() - t_run
    if mlog.metrics is not None and tcfg.eval_every:  # the end point of the forgetting curves
        mlog.eval_point(state, evaluate_point(engine.module, tokenizer, eval_recs, tcfg, seq_len, eval_tasks))
    mlog.close(state, w_now if loss_hist else None)

    extra: dict[str, Any] = {"steps": state.step, "tokens": state.tokens, "world size": world,
                             "final loss": loss_hist[-1] if loss_hist else float("nan"),
                             "tokens/s": (len(loss_hist) * global_seqs * seq_len / run_s) if run_s > 0 else 0.0,
                             "data+mixture share of step time": (data_s + mix_s) / run_s if run_s > 0 else 0.0,
                             "data loader s": data_s, "mixture eval+update s": mix_s, "run s": run_s,
                             "mixture": "proxy" if spec.proxy else tcfg.mixture, **engine_info}
    write_outputs(spec, engine, tokenizer, state, proxy_run, extra)
    torch.distributed.barrier()
    if job is not None:
        job.results.setdefault(job.tasks[0].name, TaskResult()).files += [
            "model", "metrics.jsonl", "weights.jsonl", "avg_weights.json"]
        job.complete(job.tasks[0], seconds=state.elapsed)
        return job.finish(extra=extra) | {"losses": loss_hist}
    return {"losses": loss_hist, **extra}


def optimizer_step(engine: Any, data: np.ndarray, micro: int, accum: int, rank: int, world: int) -> float:
    """One optimizer step over ``accum`` micro-batches of this rank's rows; the loss averaged over
    micro-batches and ranks."""
    step_loss = 0.0
    for j in range(accum):
        lo = (j * world + rank) * micro
        x = torch.from_numpy(data[lo:lo + micro])
        outp = engine(input_ids=x, labels=x)
        engine.backward(outp.loss)
        engine.step()
        step_loss += float(outp.loss.detach().float()) / accum
    loss_t = torch.tensor([step_loss], dtype=torch.float64)
    if world > 1:
        torch.distributed.all_reduce(loss_t)
        loss_t /= world
    return float(loss_t.item())
