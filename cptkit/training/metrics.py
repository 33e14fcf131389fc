"""The per-step metrics log of a training run: ``metrics.jsonl`` (a line per step and per eval
point) and ``weights.jsonl`` (the mixture weights at each event), written by rank 0 as it goes
(:class:`MetricsLog`; a resumed run first drops the lines after its checkpoint, so its files equal
an unbroken run's), and reading them back (:func:`eval_curves`,
:func:`run_dir_of`). The figures drawn from them are :mod:`cptkit.training.plots`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cptkit.core.records import jsonl_lines
from cptkit.core.shards import atomic_write_bytes

if TYPE_CHECKING:  # types only: reading a metrics log back needs neither torch nor a run
    from cptkit.training.monitor import Monitor
    from cptkit.training.state import RunSpec, TrainState


def truncate_jsonl(path: Path, max_step: int) -> None:
    if not path.exists():
        return
    keep = [line for line, row in jsonl_lines(path) if row["step"] <= max_step]
    atomic_write_bytes(path, ("\n".join(keep) + "\n").encode() if keep else b"")


class MetricsLog:
    """``metrics.jsonl`` (a line per step and per eval point) and ``weights.jsonl`` (the mixture
    weights at init, each stage and update, and the end), written by rank 0; each step's row also
    goes to the :class:`~cptkit.training.monitor.Monitor` (progress, TensorBoard, W&B)."""

    FILES = ("metrics.jsonl", "weights.jsonl")

    def __init__(self, spec: RunSpec, monitor: Monitor, resumed_at: int | None):
        self.monitor = monitor
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
            self.monitor.step(step, rec)

    def eval_point(self, state: TrainState, point: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps({"step": state.step, "tokens": state.tokens, "event": "eval", **point,
                                           "eval_tokens": state.tokens}) + "\n")
            self.monitor.scalars(state.step, point)

    def close(self, state: TrainState, last_weights: dict[str, float] | None) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.weights is not None:
            if last_weights is not None:  # the weights in force at the end: a static run's trajectory is a line
                self.weights.write(json.dumps({"step": state.step, "tokens": state.tokens, "event": "end",
                                               "weights": {d: round(v, 6) for d, v in last_weights.items()}}) + "\n")
            self.weights.close()
        self.monitor.close()


def eval_curves(rows: list[dict]) -> tuple[list[int], dict[str, list[float]], dict[str, list[float]]]:
    """From ``metrics.jsonl`` rows: eval token positions, loss per domain and score per task, aligned."""
    pts = [r for r in rows if "eval_loss" in r]
    tokens = [int(r.get("eval_tokens", r["tokens"])) for r in pts]
    domains: list[str] = []
    tasks: list[str] = []
    for r in pts:
        domains += [d for d in r["eval_loss"] if d not in domains]
        tasks += [t for t in (r.get("eval_tasks") or {}) if t not in tasks]
    nan = float("nan")
    losses = {d: [float(r["eval_loss"].get(d, nan)) for r in pts] for d in domains}
    scores = {t: [float((r.get("eval_tasks") or {}).get(t, nan)) for r in pts] for t in tasks}
    return tokens, losses, scores


def run_dir_of(results: dict[str, Any]) -> Path | None:
    """The training run behind an ``evaluate`` result: its model's parent, when it holds metrics.jsonl."""
    model = ((results.get("config") or {}).get("eval") or {}).get("model")
    if not model:
        return None
    d = Path(str(model)).parent
    return d if (d / "metrics.jsonl").exists() else None
