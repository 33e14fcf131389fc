"""The ``train`` step's typed config (:class:`TrainJob`): the model (``model.*``) and the training
options (``train.*``), each value checked at compose time (a bad one is refused with one line naming
its key). These checks are the one place: the engine and the loop take the values as given."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cptkit.core.config import JobConfig, check
from cptkit.core.run import OneOf, later_key
from cptkit.mixtures.controller import CONTROLLERS, STATIC_MIXTURES, mixture_names
from cptkit.mixtures.options import DBLConfig, MixtureOptions, TopicPPLConfig, VelocituneConfig
from cptkit.training.schedule import DECAY_TYPES, SCHEDULES


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
    tie_embeddings: bool = False  # tiny_llama: the output layer is the input embedding matrix (as in SmolLM2)

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


DISTILL_ON = ("replay", "all")


@dataclass
class DistillConfig:
    """Distillation to the base (docs/forgetting.md): loss = CE + kl · KL(teacher ‖ student) per token."""

    kl: float = 0.0  # λ; 0: off
    on: str = "replay"  # replay (the stream's replay domains' tokens) | all (every token)
    # the frozen teacher (HF folder, .gguf or smollm2); null: the model this run starts from. With on=replay and
    # a stream whose replay holds stored top-k log-probs (mix.replay.self.topk), null means no teacher forward
    teacher: str | None = None

    def __post_init__(self) -> None:
        check(self.kl >= 0 and math.isfinite(self.kl), "kl", self.kl, "must be a finite number ≥ 0 (0: off)")
        check(self.on in DISTILL_ON, "on", self.on, f"use one of {', '.join(DISTILL_ON)}")


#: The built-in callbacks by name (cptkit/training/callbacks/), in the order they are added; ``proxy``
#: exists in a Velocitune proxy run only.
BUILTIN_CALLBACKS = ("mixture", "evaluator", "metrics", "proxy", "checkpointer")
#: Built-ins no run can do without, and why: ``train.callbacks`` cannot disable them.
MANDATORY = {"mixture": "it enters the mixture's stages and updates its weights",
             "metrics": "metrics.jsonl is one of the run's outputs"}


@dataclass(frozen=True)
class CallbackSpec:
    """One entry of ``train.callbacks``: a built-in's name or ``package.module:Class``, the keyword
    arguments its class is built with, and whether it runs."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True


def callback_specs(raw: Any) -> list[CallbackSpec]:
    """``train.callbacks`` in any of its forms, as :class:`CallbackSpec` s in the order written; a
    ``ValueError`` names what is wrong (an unknown built-in, a bad entry, a name given twice)."""
    if raw is None:
        return []
    if isinstance(raw, Mapping):  # {name: {arg: value, ..., enabled: false}} or {name: null}
        entries = [_entry(name, {} if a is None else a) for name, a in raw.items()]
    elif isinstance(raw, Sequence) and not isinstance(raw, str):
        entries = [_entry(e, {}) if isinstance(e, str) else _listed(e) for e in raw]
    else:
        raise ValueError("give a list or a mapping of callbacks")
    names = [e.name for e in entries]
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise ValueError(f"{twice[0]} is named twice")
    return entries


def _listed(e: Any) -> CallbackSpec:
    if not isinstance(e, Mapping) or "name" not in e or set(e) - {"name", "args", "enabled"}:
        raise ValueError(f"{dict(e) if isinstance(e, Mapping) else e!r}: an entry is package.module:Class or "
                         "{name: ..., args: {...}, enabled: true|false}")
    return _entry(e["name"], {**(e.get("args") or {}), "enabled": e.get("enabled", True)})


def _entry(name: Any, args: Any) -> CallbackSpec:
    name = str(name)
    if ":" not in name and name not in BUILTIN_CALLBACKS:
        raise ValueError(f"{name}: not a built-in ({', '.join(BUILTIN_CALLBACKS)}); name your own as "
                         "package.module:Class")
    if not isinstance(args, Mapping):
        raise ValueError(f"{name}: its arguments must be a mapping, got {args!r}")
    kwargs = dict(args)
    enabled = kwargs.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"{name}: enabled must be true or false, got {enabled!r}")
    if ":" not in name and kwargs:
        raise ValueError(f"{name}: a built-in takes no arguments (its settings are train.*), only enabled")
    return CallbackSpec(name, kwargs, enabled)


def as_list(raw: Any) -> list[Any] | None:
    """A setting that takes one value or a list of them, as a list (None stays None)."""
    if raw is None:
        return None
    return list(raw) if isinstance(raw, Sequence) and not isinstance(raw, str) else [raw]


@dataclass
class TrainOptions:
    mixture: str = "static"  # static | static_avg | staged | topic_ppl | velocitune | dbl | package.module:Class (a Controller)
    # static: null/stages (each stage's weights in turn), or one mixture: {domain: w}, tokens, uniform, stage:NAME
    # (a stage's weights), average (the stages' weights averaged over the plan: each domain's tokens spread evenly)
    weights: Any = None
    weights_from: str | None = None  # static_avg: a run's avg_weights.json (or its directory): one mixture at its weights
    # a run's output directory: start from its last checkpoint's weights and AdamW state, on this run's own
    # stream and schedule (a WSD decay branch off a constant-LR trunk: warmup=0, decay=all steps)
    branch_from: str | None = None
    init_weights: Any = None  # dynamic start in each stage: {domain: w}, uniform, stage, tokens; null: per method
    controller_stages: Any = None  # stages a dynamic mixture acts in (null: all); the others keep their static weights
    micro_batch: int = 4
    grad_accum: int = 1
    budget_tokens: float = 0.0  # 0: the stream's planned tokens
    max_steps: int = 0  # 0: from the budget
    optimizer: str = "adamw"  # adamw | lion (LionW, decoupled weight decay; cptkit/training/optim.py)
    schedule: str = "wsd"  # wsd (warmup, constant, decay) | rsqrt (warmup, peak·sqrt(warmup/step), cooldown)
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
    gradient_checkpointing: Any = "auto"  # auto (on from 1e8 parameters on GPU, 1e9 on CPU) | true | false
    kernels: str = "none"  # none | liger (Liger-Kernel's RoPE, RMSNorm, SwiGLU, fused linear cross-entropy; GPU)
    # torch.compile the training forward (torch engine): on CPU SmolLM2-135M steps ~3% faster after ~1 min of
    # compiling, so it pays from a few hundred steps (docs/benchmarks.md, train_compile)
    compile: bool = False
    deepspeed_config: str | None = None  # a JSON/YAML DeepSpeed file; its stage/optimizer/scheduler win
    save_every: int = 0  # optimizer steps between checkpoints (0: only at the end)
    keep_last: int = 2
    keep_checkpoints: bool = True  # false: a finished run keeps its model only (1.6 GB less for SmolLM2; not extendable)
    resume: bool = False
    save_initial: bool = False  # also save the model before training as OUT/model_init (HF format)
    eval_docs: int = 8  # held-out docs per domain used for eval losses (0: all)
    eval_max_tokens: int = 256
    eval_every: int = 0  # per-domain eval losses every N steps, before step 1 and after the last (0: off)
    eval_tasks: list[str] = field(default_factory=list)  # few-shot tasks (conf/eval/tasks) at every eval point
    # JSONL files or directories scored at every eval point beside the stream's held-out documents, grouped by
    # their "domain" field: the forgetting curves of a probe or of outside text (never the mixture's decisions)
    eval_extra: list[str] = field(default_factory=list)
    eval_tasks_limit: int = 50  # first N items per task (0: all)
    eval_tasks_shots: int | None = 0  # null: the task's default
    threads: int = 0  # torch CPU threads (0: torch's default)
    plot: bool = True
    tensorboard: bool = True  # OUT/tensorboard: loss, LR, tokens/s, weights, per-domain eval losses
    wandb: Any = "auto"  # auto: log to W&B when wandb is installed and WANDB_PROJECT/WANDB_MODE/WANDB_API_KEY is set
    log_every: int = 0  # progress lines when stderr is not a terminal (0: every ~10% of the steps)
    backend: str = "auto"  # gloo on CPU, nccl on GPU
    # the training callbacks (docs/training.md, "Callbacks"): [package.module:Class, ...], a list of
    # {name, args, enabled} or {name: {arg: value, enabled: false}}; a name is a built-in or package.module:Class
    callbacks: Any = None
    topic_ppl: TopicPPLConfig = field(default_factory=TopicPPLConfig)
    velocitune: VelocituneConfig = field(default_factory=VelocituneConfig)
    dbl: DBLConfig = field(default_factory=DBLConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    def __post_init__(self) -> None:
        """Refuse invalid ``train.*`` values with one line each, before anything is written."""
        from cptkit.training.kernels import KERNELS  # deferred: numpy, torch
        from cptkit.training.optim import OPTIMIZERS  # deferred: numpy, torch

        check(self.mixture in STATIC_MIXTURES or self.mixture in CONTROLLERS or ":" in self.mixture, "mixture",
              self.mixture, f"use one of {', '.join(mixture_names())} or package.module:Class")
        stages = as_list(self.controller_stages) or []
        check(all(isinstance(x, str | int) and not isinstance(x, bool) for x in stages), "controller_stages",
              self.controller_stages, "give a stage's name or a list of them")
        check((self.mixture == "static_avg") == bool(self.weights_from), "weights_from", self.weights_from,
              "give it with train.mixture=static_avg (a run's avg_weights.json), and only then")
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
        check(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"use one of {', '.join(OPTIMIZERS)}")
        check(self.schedule in SCHEDULES, "schedule", self.schedule, f"use one of {', '.join(SCHEDULES)}")
        check(self.decay_type in DECAY_TYPES, "decay_type", self.decay_type, f"use one of {', '.join(DECAY_TYPES)}")
        check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "betas", self.betas,
              "two values in [0, 1)")
        check(self.precision in ("auto", "bf16", "fp32", "fp16"), "precision", self.precision,
              "use auto, bf16, fp32 or fp16 (GPU)")
        check(self.engine in ("auto", "deepspeed", "torch"), "engine", self.engine, "use auto, deepspeed or torch")
        check(self.kernels in KERNELS, "kernels", self.kernels, f"use one of {', '.join(KERNELS)}")
        check(self.zero_stage is None or self.zero_stage in (0, 1, 2, 3), "zero_stage", self.zero_stage,
              "use 0, 1, 2 or 3 (or null: the deepspeed group's)")
        check(str(self.gradient_checkpointing).lower() in ("auto", "true", "false"), "gradient_checkpointing",
              self.gradient_checkpointing, "use auto, true or false")  # Any: a bool or auto
        try:
            specs = callback_specs(self.callbacks)
        except ValueError as e:
            check(False, "callbacks", self.callbacks, str(e))
        for cb in specs:
            if not cb.enabled:
                check(cb.name not in MANDATORY, "callbacks", cb.name, f"the run cannot do without it ({MANDATORY.get(cb.name)})")
                check(cb.name != "checkpointer" or (not self.keep_checkpoints and not self.save_every), "callbacks",
                      cb.name, "disabling it needs train.keep_checkpoints=false and train.save_every=0 (a run "
                               "that keeps or resumes from checkpoints needs them written)")
                check(cb.name != "proxy" or not self.velocitune.proxy, "callbacks", cb.name,
                      "train.velocitune.proxy=true runs stop through it")
        check(self.distill.kl == 0 or self.kernels == "none", "kernels", self.kernels,
              "train.distill needs the model's logits, which the fused loss never forms; use train.kernels=none")

    def mixture_options(self) -> MixtureOptions:
        """The settings the run's mixture is built from (:func:`cptkit.mixtures.factory.make_controller`)."""
        stages = as_list(self.controller_stages)  # Any: a stage's name or a list of them, as written
        names = None if stages is None else [str(x) for x in stages]
        return MixtureOptions(mixture=self.mixture, weights=self.weights, weights_from=self.weights_from,
                              init_weights=self.init_weights, controller_stages=names, topic_ppl=self.topic_ppl,
                              velocitune=self.velocitune, dbl=self.dbl)


# keys added after train outputs were recorded without them: left out of the record at these values
later_key("model.tie_embeddings", False)
later_key("train.weights_from", None)
later_key("train.branch_from", None)
later_key("train.callbacks", OneOf((None, [])))  # null since it also takes a mapping; [] before
later_key("train.distill", {"kl": 0.0, "on": "replay", "teacher": None})


@dataclass
class TrainJob(JobConfig):
    tokenizer: str | None = None  # default: the stream's tokenizer
    trust_remote_code: bool = False  # let model.path / tokenizer folders run their own Python code (auto_map)
    model: ModelConfig = field(default_factory=ModelConfig)  # cptkit/training/config.py
    train: TrainOptions = field(default_factory=TrainOptions)  # cptkit/training/config.py
    deepspeed: Any = field(default_factory=dict)
