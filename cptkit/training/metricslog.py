"""``metrics.jsonl`` and ``weights.jsonl`` of a training run, written by rank 0 as it goes; a
resumed run first drops the lines after its checkpoint, so its files equal an unbroken run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cptkit.core.records import jsonl_lines
from cptkit.core.shards import atomic_write_bytes
from cptkit.training.state import RunSpec, TrainState


def truncate_jsonl(path: Path, max_step: int) -> None:
    if not path.exists():
        return
    keep = [line for line, row in jsonl_lines(path) if row["step"] <= max_step]
    atomic_write_bytes(path, ("\n".join(keep) + "\n").encode() if keep else b"")



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
                truncate_jsonl(spec.out / name, resumed_at)
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
