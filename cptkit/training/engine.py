"""Training engines: DeepSpeed (process group, config, CPU workarounds) and one-process torch.

On CPU, DeepSpeed would JIT-compile two C++ ops with g++ (~4 minutes): the shared-memory
all-reduce op, built inside ``init_distributed``, and fused Adam. We skip the first by
replacing ``build_shm_op`` in the module ``deepspeed.comm.torch`` (reached through
``sys.modules``: ``import deepspeed.comm.torch`` gives the ``torch`` package itself), and use
``torch_adam`` for the second; collectives then go through gloo. On GPU nothing is patched.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from cptkit.core.errors import CptkitError
from cptkit.core.net import free_port
from cptkit.core.progress import log
from cptkit.training.checkpoint import guard_deepspeed, latest_tag, load_torch, save_torch
from cptkit.training.config import TrainOptions
from cptkit.training.kernels import apply_kernels
from cptkit.training.optim import make_optimizer
from cptkit.training.schedule import Schedule, torch_scheduler
from cptkit.training.state import Engine, EngineKind


def on_gpu() -> bool:
    return torch.cuda.is_available()


def slurm_env() -> None:
    """Map SLURM's task variables onto torch.distributed's when launched by ``srun``.

    SLURM's variables win over an inherited ``RANK``/``WORLD_SIZE`` (a parent process may have
    exported its own), except under a launcher of its own (``torchrun``, ``deepspeed``). A job of
    one task (a sweep's array member) rendezvouses on a free port of its own, like any single
    process; the tasks of a multi-task job agree on a port derived from the job id, so that jobs
    sharing a node never collide on one fixed port.
    """
    launcher = "TORCHELASTIC_RUN_ID" in os.environ or "CROSS_RANK" in os.environ
    if "SLURM_PROCID" in os.environ and not launcher:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        if os.environ["WORLD_SIZE"] != "1":
            os.environ.setdefault("MASTER_ADDR", socket.gethostname())
            os.environ.setdefault("MASTER_PORT", str(slurm_port(os.environ.get("SLURM_JOB_ID", "0"))))


def slurm_port(job_id: str) -> int:
    """The rendezvous port of a multi-task SLURM job: 20000-39999, from its job id."""
    return 20000 + int(job_id) % 20000 if job_id.isdigit() else 29500


def init_distributed(backend: str = "auto") -> tuple[int, int]:
    """Initialise (once) the process group; returns (rank, world size). Single process needs no launcher."""
    if not on_gpu():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    slurm_env()
    added: list[str] = []
    single = os.environ.get("WORLD_SIZE", "1") == "1" and "MASTER_PORT" not in os.environ
    if single and not torch.distributed.is_initialized():  # one process, no launcher
        added = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
    import deepspeed
    import deepspeed.comm  # noqa: F401  (loads deepspeed.comm.torch)

    if not on_gpu():
        mod = sys.modules.get("deepspeed.comm.torch")
        if mod is not None and hasattr(mod, "build_shm_op"):
            mod.build_shm_op = lambda: None  # no g++ JIT build of the shm all-reduce op on CPU
    if backend == "auto":
        backend = "nccl" if on_gpu() else "gloo"
    try:
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend=backend, verbose=False)
    finally:
        for k in added:  # child processes must not inherit this process's rendezvous port
            os.environ.pop(k, None)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16); elsewhere it is emulated."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str) -> str:
    """``auto``: bf16 on a GPU that has it or a CPU with native bf16, otherwise fp32."""
    if precision != "auto":
        return precision
    if on_gpu():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_bf16() else "fp32"


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def deepspeed_config(base: dict[str, Any], *, micro_batch: int, grad_accum: int, world: int, lr: float,
                     betas: tuple[float, float], eps: float, weight_decay: float, grad_clip: float,
                     precision: str, zero_stage: int | None, user: dict[str, Any] | None = None,
                     user_name: str = "train.deepspeed_config", optimizer: str = "adamw") -> dict[str, Any]:
    """The DeepSpeed config: ``base`` (``conf/deepspeed/*.yaml``), then ``user`` (a JSON/YAML file) over it.

    What the user file sets wins: ZeRO stage, optimizer, scheduler, clipping, precision. Batch
    sizes must agree with ``train.micro_batch``/``grad_accum`` (cptkit slices the data by them),
    and an explicit ``train.zero_stage`` or ``train.precision`` that contradicts the file is an
    error rather than a silent choice. ``precision`` may be ``auto`` (see :func:`resolve_precision`).
    ``optimizer="lion"`` leaves ``optimizer`` out: :func:`make_engine` hands DeepSpeed a client
    :class:`~cptkit.training.optim.LionW` (ZeRO wraps it; ``zero_allow_untested_optimizer``).
    """
    user = dict(user or {})
    cfg = _merge(base, user)
    want = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "train_batch_size": micro_batch * grad_accum * world}
    for key, value in want.items():
        if key in user and int(user[key]) != value:
            raise CptkitError(f"{user_name}: {key}={user[key]} disagrees with train.micro_batch={micro_batch} "
                              f"× train.grad_accum={grad_accum} × {world} process(es) = {value}; set train.* to match")
        cfg[key] = value
    cfg.setdefault("gradient_clipping", grad_clip)
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("wall_clock_breakdown", False)
    zero = dict(cfg.get("zero_optimization") or {})
    user_stage = (user.get("zero_optimization") or {}).get("stage")
    if zero_stage is not None:
        if user_stage is not None and int(user_stage) != int(zero_stage):
            raise CptkitError(f"{user_name}: zero_optimization.stage={user_stage} contradicts "
                              f"train.zero_stage={zero_stage}; drop one of them")
        zero["stage"] = int(zero_stage)
    zero.setdefault("stage", 0)
    cfg["zero_optimization"] = zero
    file_prec = [p for p in ("bf16", "fp16") if (user.get(p) or {}).get("enabled")]
    if file_prec:
        if precision not in ("auto", file_prec[0]):
            raise CptkitError(f"{user_name}: {file_prec[0]}.enabled=true contradicts train.precision={precision}; "
                              "drop one of them")
        precision = file_prec[0]
    precision = resolve_precision(precision)
    cfg["bf16"] = {**(cfg.get("bf16") or {}), "enabled": precision == "bf16"}
    cfg["fp16"] = {**(cfg.get("fp16") or {}), "enabled": precision == "fp16"}
    if "optimizer" in user and optimizer != "adamw":
        raise CptkitError(f"{user_name}: its optimizer contradicts train.optimizer={optimizer}; drop one of them")
    if "optimizer" in user:  # the user's optimizer and its hyper-parameters win over train.lr/betas/...
        opt = dict(user["optimizer"])
        opt["params"] = dict(opt.get("params") or {})
        if not on_gpu() and str(opt.get("type", "")).lower() in ("adam", "adamw"):
            opt["params"].setdefault("torch_adam", True)  # no fused_adam JIT build on CPU
        cfg["optimizer"] = opt
    elif optimizer != "adamw":  # a client torch optimizer (make_engine); ZeRO wraps it
        cfg.pop("optimizer", None)
        cfg["zero_allow_untested_optimizer"] = True
    else:
        # torch's fused AdamW: no JIT build of DeepSpeed's FusedAdam, which needs nvcc
        params = {"lr": lr, "betas": list(betas), "eps": eps, "weight_decay": weight_decay, "torch_adam": True,
                  "fused": True}  # one kernel for every tensor, on a GPU and on a CPU
        cfg["optimizer"] = {"type": "AdamW", "params": params}
    if "scheduler" not in user:
        cfg.pop("scheduler", None)  # the LR schedule is cptkit's (train.lr, warmup, decay)
    return cfg


def use_deepspeed(engine: str, world: int, user_config: bool, zero_stage: int) -> bool:
    """``train.engine=auto``: DeepSpeed on GPU, with several processes, a user DeepSpeed file or ZeRO-3;
    one CPU process otherwise runs :class:`TorchEngine` (ZeRO has nothing to shard across one process).
    ``engine`` is one of auto, deepspeed, torch (checked by ``TrainOptions``)."""
    if engine == "deepspeed":
        return True
    if engine == "torch":
        if world > 1:
            raise CptkitError(f"train.engine=torch runs one process, not {world}; use train.engine=deepspeed")
        if user_config:
            raise CptkitError("train.engine=torch ignores DeepSpeed settings: drop train.deepspeed_config "
                              "or use train.engine=deepspeed")
        return False
    return on_gpu() or world > 1 or user_config or zero_stage >= 3


class TorchEngine(Engine):
    """One process, plain PyTorch: the loop a user would write, behind DeepSpeed's engine interface.

    AdamW (``torch.optim``, fused) or LionW (``train.optimizer``), gradient clipping, gradient accumulation (``backward``
    scales by 1/accum; ``step`` updates at the boundary), bf16 through ``torch.autocast`` over
    fp32 weights, and checkpoints read with ``weights_only=True`` (:mod:`cptkit.training.checkpoint`).
    The learning rate is ``schedule``'s: the optimizer is built with its peak and follows it step by step.
    """

    def __init__(self, model: torch.nn.Module, groups: list[dict[str, Any]], *, schedule: Schedule,
                 betas: tuple[float, float], eps: float, grad_clip: float, precision: str, grad_accum: int,
                 optimizer: str = "adamw", compile_forward: bool = False):
        device = "cuda" if on_gpu() else "cpu"
        self.module = model.to(device)  # before the optimizer: fused AdamW takes the parameters where they live
        self.device = device
        self.optimizer = make_optimizer(optimizer, groups, lr=schedule.peak_lr, betas=betas, eps=eps)
        self.lr_scheduler = torch_scheduler(self.optimizer, schedule)
        self.grad_clip = float(grad_clip)
        self.precision = precision
        self.accum = int(grad_accum)
        self.micro_steps = 0
        self.global_steps = 0
        self._autocast = precision in ("bf16", "fp16")
        self._dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        # the training forward only: evaluation, saving and checkpoints use the module itself
        self._forward = torch.compile(self.module, dynamic=False) if compile_forward else self.module

    def zero_optimization_stage(self) -> int:
        return 0

    def __call__(self, **kw: Any) -> Any:
        kw = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        if self._autocast:
            with torch.autocast(self.device, dtype=self._dtype):
                return self._forward(**kw)
        return self._forward(**kw)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.accum if self.accum > 1 else loss).backward()

    def step(self) -> None:
        self.micro_steps += 1
        if self.micro_steps % self.accum:
            return
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.global_steps += 1

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict[str, Any]) -> None:
        save_torch(Path(save_dir), tag, {
            "module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "global_steps": self.global_steps, "micro_steps": self.micro_steps, "client_state": client_state})

    def load_checkpoint(self, load_dir: str) -> tuple[str | None, dict[str, Any] | None]:
        ckdir = Path(load_dir)
        tag = latest_tag(ckdir)
        if tag is None:
            return None, None
        state = load_torch(ckdir, tag)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.global_steps = int(state.get("global_steps", 0))
        self.micro_steps = int(state.get("micro_steps", 0))
        return str(ckdir / tag), state["client_state"]


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Optimizer groups: no weight decay on biases, norms and other 1-D parameters."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_user_deepspeed(path: str | None) -> dict[str, Any]:
    """A user DeepSpeed config (JSON or YAML) as a dict; missing or malformed files are one-line errors."""
    if not path:
        return {}
    p = Path(str(path))
    if not p.is_file():
        raise CptkitError(f"train.deepspeed_config={p}: no such file")
    try:
        if p.suffix == ".json":
            data = json.loads(p.read_text())
        else:
            data = OmegaConf.to_container(OmegaConf.load(p), resolve=True)
    except Exception as e:  # noqa: BLE001 - any parse error is the user's file
        raise CptkitError(f"{p}: not a valid DeepSpeed config: {str(e).splitlines()[0] if str(e) else e}") from None
    if not isinstance(data, dict):
        raise CptkitError(f"{p}: a DeepSpeed config must be a mapping, got {type(data).__name__}")
    return data


def checkpointing_wanted(setting: bool | str, model: torch.nn.Module, gpu: bool | None = None) -> bool:
    """``train.gradient_checkpointing`` (true, false or auto; checked by ``TrainOptions``): auto = on for
    models of ≥ 1e8 parameters on a GPU (whose memory is the limit) and of ≥ 1e9 on CPU, where RAM holds
    the activations of a 135M model many times over and recomputing the forward would cost a third more
    compute per step."""
    if str(setting).lower() in ("true", "false"):
        return str(setting).lower() == "true"
    gpu = on_gpu() if gpu is None else gpu
    return sum(p.numel() for p in model.parameters()) >= (100_000_000 if gpu else 1_000_000_000)


def enable_checkpointing(model: torch.nn.Module) -> None:
    if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def lr_source(user: dict[str, Any], user_name: str | None, schedule: Schedule) -> str:
    """Who sets the learning rate: ``cptkit`` (the schedule, from ``train.lr``: the one source) or
    ``deepspeed (user file)`` (a DeepSpeed file's own ``scheduler``, said in one log line).

    A file's ``optimizer.params.lr`` without a scheduler of its own must equal ``train.lr``: a peak
    that differs is refused with one line naming the file and the key, never taken silently."""
    if "scheduler" in user:
        log.info("%s: its scheduler (%s) sets the learning rate; train.lr, train.schedule, train.warmup and "
                 "train.decay are not used", user_name, (user["scheduler"] or {}).get("type"))
        return "deepspeed (user file)"
    user_lr = ((user.get("optimizer") or {}).get("params") or {}).get("lr")
    if user_lr is not None and float(user_lr) != schedule.peak_lr:
        raise CptkitError(f"{user_name}: optimizer.params.lr={user_lr} disagrees with train.lr={schedule.peak_lr}, "
                          "the schedule's peak and the one source of the learning rate; drop the key from the "
                          f"file or set train.lr={user_lr}")
    return "cptkit"


def _engine_config(tcfg: TrainOptions, deepspeed_base: dict[str, Any], world: int,
                   user: dict[str, Any], schedule: Schedule) -> tuple[dict[str, Any], str, bool]:
    """The DeepSpeed config, the precision it resolves to and whether DeepSpeed runs (refusals first,
    before anything touches the model)."""
    ds_cfg = deepspeed_config(deepspeed_base, micro_batch=tcfg.micro_batch, grad_accum=tcfg.grad_accum, world=world,
                              lr=schedule.peak_lr, betas=(tcfg.betas[0], tcfg.betas[1]), eps=tcfg.eps,
                              weight_decay=tcfg.weight_decay, grad_clip=tcfg.grad_clip, precision=tcfg.precision,
                              zero_stage=tcfg.zero_stage, user=user, user_name=str(tcfg.deepspeed_config),
                              optimizer=tcfg.optimizer)
    stage = int(ds_cfg["zero_optimization"]["stage"])
    precision = "bf16" if ds_cfg["bf16"]["enabled"] else "fp16" if ds_cfg["fp16"]["enabled"] else "fp32"
    if precision == "fp16" and not on_gpu():
        raise CptkitError("train.precision=fp16 needs a GPU; use bf16 or fp32 on CPU")
    kernels = tcfg.kernels
    if kernels != "none" and stage >= 3 and use_deepspeed(tcfg.engine, world, bool(user), stage):
        # the fused loss reads lm_head.weight without calling lm_head: ZeRO-3 would hand it an empty shard
        raise CptkitError(f"train.kernels={kernels} is refused under ZeRO-3: its fused loss reads the LM head's "
                          "weight outside that module, where ZeRO-3 holds only a shard; use deepspeed=zero2 or "
                          "train.kernels=none")
    return ds_cfg, precision, use_deepspeed(tcfg.engine, world, bool(user), stage)


def make_engine(model: torch.nn.Module, tcfg: TrainOptions, *, deepspeed_base: dict[str, Any], world: int,
                schedule: Schedule) -> tuple[Engine, EngineKind, dict[str, Any]]:
    """The engine for ``train.*`` (values as ``TrainOptions`` checked them): :class:`TorchEngine` or a
    DeepSpeed engine (checkpoint loads guarded), its learning rate following ``schedule``.

    Returns the engine, its kind (what resume and branching dispatch on) and what was chosen, as the
    manifest's rows (engine, ZeRO stage, precision, gradient checkpointing, kernels).
    ``train.kernels`` patches the model (:mod:`cptkit.training.kernels`) before the engine wraps it.
    """
    user = load_user_deepspeed(tcfg.deepspeed_config)
    ds_cfg, precision, on_deepspeed = _engine_config(tcfg, deepspeed_base, world, user, schedule)
    lr_by = lr_source(user, tcfg.deepspeed_config, schedule)
    stage = int(ds_cfg["zero_optimization"]["stage"])
    kernels = apply_kernels(model, tcfg.kernels)
    ckpt = checkpointing_wanted(tcfg.gradient_checkpointing, model)
    if ckpt:
        enable_checkpointing(model)
    model.train()
    groups = param_groups(model, tcfg.weight_decay)
    betas = (tcfg.betas[0], tcfg.betas[1])
    compiled = tcfg.compile
    engine: Engine
    if on_deepspeed:
        import deepspeed  # deferred: heavy, and only this engine needs it

        if compiled:
            log.warning("train.compile applies to the torch engine; the DeepSpeed engine runs the model uncompiled")
            compiled = False
        client = None
        if "optimizer" not in ds_cfg:  # train.optimizer=lion: DeepSpeed takes the torch optimizer as a client
            client = make_optimizer(tcfg.optimizer, groups, lr=schedule.peak_lr, betas=betas, eps=tcfg.eps)
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=None if client else groups, optimizer=client, config=ds_cfg,
            lr_scheduler=None if "scheduler" in ds_cfg else (lambda opt: torch_scheduler(opt, schedule)))
        guard_deepspeed(engine)
        got = int(engine.zero_optimization_stage())
        if got != stage:  # pragma: no cover - a DeepSpeed that ignores the config
            raise CptkitError(f"DeepSpeed runs ZeRO stage {got}, not the configured {stage}")
        kind, stage = EngineKind.DEEPSPEED, got
    else:
        engine = TorchEngine(model, groups, schedule=schedule, betas=betas, eps=tcfg.eps, grad_clip=tcfg.grad_clip,
                             precision=precision, grad_accum=tcfg.grad_accum, optimizer=tcfg.optimizer,
                             compile_forward=compiled)
        kind, stage = EngineKind.TORCH, 0
    info = {"engine": kind.value, "optimizer": str((user.get("optimizer") or {}).get("type") or tcfg.optimizer),
            "zero stage": stage, "precision": precision, "gradient checkpointing": "on" if ckpt else "off",
            "kernels": kernels, "compile": "on" if compiled else "off", "lr scheduler": lr_by}
    return engine, kind, info


def full_state_dict(engine: Any) -> dict[str, torch.Tensor] | None:
    """The whole model's weights where the module holds only a shard (ZeRO-3; call on every rank), else None."""
    if getattr(engine, "zero_optimization_stage", lambda: 0)() == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    return None
