"""DeepSpeed setup: process group, engine config, CPU workarounds (see docs/training.md).

On CPU, DeepSpeed would JIT-compile two C++ ops with g++ (~4 minutes): the shared-memory
all-reduce op, built inside ``init_distributed``, and fused Adam. We skip the first by
replacing ``build_shm_op`` in the module ``deepspeed.comm.torch`` (reached through
``sys.modules``: ``import deepspeed.comm.torch`` gives the ``torch`` package itself), and use
``torch_adam`` for the second; collectives then go through gloo. On GPU nothing is patched.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import torch


def on_gpu() -> bool:
    return torch.cuda.is_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_env() -> None:
    """Map SLURM's task variables onto torch.distributed's when launched by ``srun``."""
    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        os.environ.setdefault("MASTER_ADDR", socket.gethostname())
        os.environ.setdefault("MASTER_PORT", "29500")


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


def deepspeed_config(base: dict[str, Any], *, micro_batch: int, grad_accum: int, world: int, lr: float,
                     betas: tuple[float, float], eps: float, weight_decay: float, grad_clip: float,
                     precision: str, zero_stage: int | None) -> dict[str, Any]:
    """The DeepSpeed config: ``base`` (conf/deepspeed/*.yaml or a JSON file) plus the train options."""
    cfg = {k: v for k, v in base.items()}
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["gradient_accumulation_steps"] = grad_accum
    cfg["train_batch_size"] = micro_batch * grad_accum * world
    cfg["gradient_clipping"] = grad_clip
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("wall_clock_breakdown", False)
    zero = dict(cfg.get("zero_optimization") or {})
    if zero_stage is not None:
        zero["stage"] = int(zero_stage)
    cfg["zero_optimization"] = zero
    cfg["bf16"] = {"enabled": precision == "bf16"}
    cfg["fp16"] = {"enabled": precision == "fp16"}
    params = {"lr": lr, "betas": list(betas), "eps": eps, "weight_decay": weight_decay}
    if not on_gpu():
        params["torch_adam"] = True  # no fused_adam JIT build on CPU
    cfg["optimizer"] = {"type": "AdamW", "params": params}
    cfg.pop("scheduler", None)  # the LR schedule is cptkit's (train.lr_*)
    return cfg


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no weight decay on biases, norms and other 1-D parameters."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
