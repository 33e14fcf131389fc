"""Learning-rate schedules (SPEC §9): Warmup-Stable-Decay (``wsd``) and inverse square root (``rsqrt``).

Phases: a linear warmup from ``init_lr`` to ``peak_lr``; a stable phase at ``peak_lr``; a
decay to ``min_lr_ratio · peak_lr`` over the last ``decay`` steps, shaped linear | cosine |
1-sqrt | exponential. ``warmup`` and ``decay`` are given in steps (int ≥ 1, or 0) or as
fractions of ``total_steps`` (float < 1). ``decay = 0`` keeps the LR constant after warmup
(Llama-3-SynE's CPT: 1e-7 → 1e-5, then constant).

``rsqrt`` (the domain-upsampling paper's, seed 002 §2: "an inverse square root learning schedule
similar to (Zhai et al., 2022)"; Zhai et al.'s ViT schedule: linear warmup, then
``peak·sqrt(warmup/step)``, then a linear cooldown to zero): the same linear warmup, then
``peak · sqrt(max(warmup, 1) / step)`` (equal to ``peak`` where warmup ends), then over the last
``decay`` steps the LR falls linearly (``decay_type``) from the rsqrt value where the cooldown
starts to ``min_lr_ratio`` times that value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY_TYPES = ("linear", "cosine", "1-sqrt", "exponential")
SCHEDULES = ("wsd", "rsqrt")


def phase_steps(value: float | int, total_steps: int, what: str) -> int:
    """Steps of a phase given as steps (int ≥ 1 or 0) or a fraction of ``total_steps`` (float < 1)."""
    v = float(value)
    if v < 0 or math.isnan(v):
        raise ValueError(f"{what} must be ≥ 0, got {value}")
    steps = round(v * total_steps) if (isinstance(value, float) and v < 1.0) else int(v)
    return min(steps, total_steps)


@dataclass(frozen=True)
class Schedule:
    """A resolved schedule; call ``lr(step)`` (0-based optimizer steps)."""

    peak_lr: float
    total_steps: int
    warmup_steps: int = 0
    decay_steps: int = 0
    init_lr: float = 1e-7
    decay_type: str = "linear"
    min_lr_ratio: float = 0.0
    kind: str = "wsd"

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.kind!r}")
        if self.decay_type not in DECAY_TYPES:
            raise ValueError(f"decay_type must be one of {DECAY_TYPES}, got {self.decay_type!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.decay_type == "exponential" and self.decay_steps and self.min_lr_ratio <= 0:
            raise ValueError("exponential decay needs min_lr_ratio > 0")
        if self.warmup_steps + self.decay_steps > self.total_steps:
            raise ValueError(f"warmup ({self.warmup_steps}) + decay ({self.decay_steps}) steps exceed "
                             f"total_steps ({self.total_steps})")

    @property
    def stable_end(self) -> int:
        return self.total_steps - self.decay_steps

    def rsqrt(self, step: int) -> float:
        """The inverse-square-root body: ``peak · sqrt(max(warmup, 1) / step)`` (``peak`` up to there)."""
        w = max(self.warmup_steps, 1)
        return self.peak_lr * math.sqrt(w / max(step, w))

    def lr(self, step: int) -> float:
        peak = self.peak_lr
        if step < self.warmup_steps:
            return self.init_lr + (peak - self.init_lr) * step / self.warmup_steps
        if self.kind == "rsqrt":
            if self.decay_steps == 0 or step < self.stable_end:
                return self.rsqrt(step)
            peak = self.rsqrt(self.stable_end)  # the cooldown starts where the rsqrt body stops
        elif self.decay_steps == 0 or step < self.stable_end:
            return peak
        p = min((step - self.stable_end) / self.decay_steps, 1.0)
        lo = peak * self.min_lr_ratio
        if self.decay_type == "linear":
            return peak - (peak - lo) * p
        if self.decay_type == "cosine":
            return lo + (peak - lo) * 0.5 * (1.0 + math.cos(math.pi * p))
        if self.decay_type == "1-sqrt":
            return lo + (peak - lo) * (1.0 - math.sqrt(p))
        return peak * self.min_lr_ratio ** p  # exponential


def make_schedule(peak_lr: float, total_steps: int, warmup: float | int = 0, decay: float | int = 0,
                  init_lr: float = 1e-7, decay_type: str = "linear", min_lr_ratio: float = 0.0,
                  kind: str = "wsd") -> Schedule:
    """Build a :class:`Schedule` (``kind``: wsd | rsqrt) with phases in steps or fractions of ``total_steps``."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    return Schedule(peak_lr=float(peak_lr), total_steps=int(total_steps),
                    warmup_steps=phase_steps(warmup, total_steps, "warmup"),
                    decay_steps=phase_steps(decay, total_steps, "decay"), init_lr=float(init_lr),
                    decay_type=str(decay_type), min_lr_ratio=float(min_lr_ratio), kind=str(kind))


def lr_at(step: int, **kw) -> float:
    """Learning rate at ``step`` for the schedule given by ``make_schedule``'s keywords."""
    return make_schedule(**kw).lr(step)


def torch_scheduler(optimizer, schedule: Schedule):
    """A ``torch.optim.lr_scheduler.LambdaLR`` following ``schedule``, which owns the learning rate: every
    group's base LR is set to the schedule's peak (whatever the optimizer was built with) and step ``s``
    runs at ``peak · lr(s) / peak``."""
    from torch.optim.lr_scheduler import LambdaLR

    for group in optimizer.param_groups:
        group["lr"] = schedule.peak_lr
        group["initial_lr"] = schedule.peak_lr
    return LambdaLR(optimizer, lambda step: schedule.lr(step) / schedule.peak_lr)
