"""Optimizers for ``train.optimizer``: AdamW (``torch.optim``, fused) or Lion with decoupled weight decay.

Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms", Alg. 2), the optimizer
of the domain-upsampling paper (seed 002, Table 1: LionW, lr 1.2e-4, β = (0.9, 0.95), weight
decay 1.2e-4). Per parameter θ with gradient g and momentum m (zero at start)::

    c = β1·m + (1 − β1)·g
    θ ← θ − lr·(sign(c) + λ·θ)        (λ: the group's weight_decay)
    m ← β2·m + (1 − β2)·g
"""

from __future__ import annotations

from typing import Any

import torch

OPTIMIZERS = ("adamw", "lion")


class LionW(torch.optim.Optimizer):
    """Lion with decoupled weight decay (the Lion paper's update; a plain ``torch.optim.Optimizer``,
    so DeepSpeed takes it as a client optimizer)."""

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be ≥ 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                c = m.mul(b1).add_(g, alpha=1.0 - b1)
                if wd:
                    p.mul_(1.0 - lr * wd)  # −lr·λ·θ, with θ before this step's sign update
                p.add_(c.sign_(), alpha=-lr)
                m.mul_(b2).add_(g, alpha=1.0 - b2)
        return loss


def fusable(groups: list[dict[str, Any]]) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating point, on a CPU or a CUDA device."""
    params = [p for g in groups for p in g["params"]]
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def make_optimizer(name: str, groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float],
                   eps: float) -> torch.optim.Optimizer:
    """``train.optimizer``: ``adamw`` (torch's, eps used) or ``lion`` (:class:`LionW`, eps unused);
    per-group weight decay comes from ``groups``."""
    if name == "adamw":  # fused: one kernel over every tensor; torch's per-tensor loop is ~5x slower on CPU
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fusable(groups))
    if name == "lion":
        return LionW(groups, lr=lr, betas=betas)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
