"""The metrics log as a callback: each step's row to ``metrics.jsonl``, the progress bar, log lines,
TensorBoard and W&B (:class:`~cptkit.training.metrics.MetricsLog`)."""

from __future__ import annotations

from typing import Any

from cptkit.training.callbacks import Callback


class MetricsCallback(Callback):
    priority = 200  # the row is written before a proxy stop or a checkpoint
    name = "metrics"

    def post_step(self, row: dict[str, Any]) -> None:
        self.trainer.log.step(self.trainer.state.step, row)
