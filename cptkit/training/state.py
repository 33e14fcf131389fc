"""What a training run is (:class:`RunSpec`: config, stream, rank, output), what it steps (the
:class:`Engine` interface both engines implement) and where it stands (:class:`TrainState`: step,
tokens, weight sums), saved in every checkpoint with the sampler, the callbacks' states and the
torch/python/numpy RNG states (:func:`client_state`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from cptkit.core.job import Job
from cptkit.mixtures.stream import Stream
from cptkit.training.config import TrainJob, TrainOptions


@dataclass
class RunSpec:
    """What this process trains, where, and as which rank (resolved once by the step)."""

    conf: TrainJob  # ``train.resume`` as given; ``resume`` below
    stream: Stream
    proxy: bool
    resume: bool
    rank: int
    world: int
    out: Path
    job: Job | None  # the Job on rank 0, None elsewhere

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


class EngineKind(Enum):
    """Which engine runs (:func:`~cptkit.training.engine.make_engine`): what resume and branching dispatch
    on. Its value is the manifest's ``engine`` row."""

    TORCH = "torch"
    DEEPSPEED = "deepspeed"


class Engine(Protocol):
    """What the loop, the checkpoints and the evaluations call of an engine: DeepSpeed's engine
    interface, which :class:`~cptkit.training.engine.TorchEngine` implements for one process."""

    module: torch.nn.Module  # the model (evaluation and saving use it; the training forward is __call__)
    device: Any

    def __call__(self, **kw: Any) -> Any:
        """The training forward (``input_ids``, ``labels``): an output with ``.loss``."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> None:
        """One micro-batch done: update the weights (and the LR) at the accumulation boundary."""

    def get_lr(self) -> list[float]:
        """The learning rate of each parameter group for the next update."""

    def zero_optimization_stage(self) -> int: ...

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict[str, Any]) -> Any:
        """Weights, optimizer and LR scheduler states, and ``client_state``, under ``save_dir/tag``."""

    def load_checkpoint(self, load_dir: str) -> tuple[str | None, dict[str, Any] | None]:
        """Load the ``latest`` checkpoint of ``load_dir``: its path and client state."""


class Stateful(Protocol):
    """What a checkpoint saves and restores: the sampler, each callback."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainState:
    """Where the run is: saved in every checkpoint with the sampler, the callbacks and RNG states."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    weight_sum: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "elapsed": self.elapsed, "weight_sum": self.weight_sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens, self.elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
        self.weight_sum = state["weight_sum"]


def client_state(state: TrainState, sampler: Stateful, callbacks: dict[str, Stateful]) -> dict[str, Any]:
    """What a checkpoint holds besides the engine's tensors: the run's state, the sampler's position,
    every callback's state (by name) and the RNG states."""
    return {**state.state_dict(), "sampler": sampler.state_dict(), "rng": rng_state(),
            "callbacks": {name: cb.state_dict() for name, cb in callbacks.items()}}


def restore(saved: dict[str, Any], state: TrainState, sampler: Stateful, callbacks: dict[str, Stateful]) -> None:
    """Load a checkpoint's :func:`client_state` back: every callback whose state it holds is restored."""
    state.load_state_dict(saved)
    sampler.load_state_dict(saved["sampler"])
    saved_cbs = saved.get("callbacks")
    if saved_cbs is None:  # a checkpoint written before callbacks: the mixture and proxy states at the top
        saved_cbs = {"mixture": saved["controller"], "proxy": {"log": saved.get("proxy_log", [])}}
    for name, cb in callbacks.items():
        if name in saved_cbs:
            cb.load_state_dict(saved_cbs[name])
    set_rng_state(saved["rng"])
