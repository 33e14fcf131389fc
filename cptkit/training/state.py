"""What a training run is (:class:`RunSpec`: config, stream, rank, output) and where it stands
(:class:`TrainState`: step, tokens, weight sums, the proxy's log), saved in every checkpoint with
the sampler, the controller and the torch/python/numpy RNG states."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from cptkit.training.config import TrainOptions


@dataclass
class RunSpec:
    """What this process trains, where, and as which rank (resolved once by the step)."""

    conf: Any  # the typed TrainJob (``train.resume`` as given; ``resume`` below)
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


def rng_state() -> dict[str, Any]:
    """torch/python/numpy RNG states as tensors, numbers and lists (``weights_only`` loadable)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [str(name), torch.from_numpy(np.asarray(key, dtype=np.int64)), int(pos), int(has_gauss),
                      float(gauss)]}


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    name, key, pos, has_gauss, gauss = s["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))


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
                "sampler": sampler.state_dict(), "controller": controller.state_dict(), "rng": rng_state(),
                "proxy_log": self.proxy_log}

    def load_state_dict(self, state: dict[str, Any], sampler: Any, controller: Any) -> None:
        self.step, self.tokens, self.elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
        self.weight_sum = state["weight_sum"]
        self.proxy_log = [tuple(x) for x in state.get("proxy_log", [])]  # type: ignore[misc]
        sampler.load_state_dict(state["sampler"])
        controller.load_state_dict(state["controller"])
        set_rng_state(state["rng"])
