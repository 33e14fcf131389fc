"""Checkpoints as a callback: the engine's state, the run's, the sampler's and every callback's
under ``OUT/checkpoints`` every ``train.save_every`` steps and at the end
(:func:`cptkit.training.checkpoint.save`; resuming is :func:`cptkit.training.checkpoint.resume`).
A run that keeps no checkpoints (``train.keep_checkpoints=false``) writes none at its last step: the
model is saved from the engine, and a 135M model's checkpoint is 1.6 GB written only to be deleted."""

from __future__ import annotations

from typing import Any

from cptkit.training import checkpoint
from cptkit.training.callbacks import Callback


class CheckpointerCallback(Callback):
    priority = -100  # last: it saves what every other callback did in this step
    name = "checkpointer"

    def post_step(self, row: dict[str, Any]) -> None:
        t = self.trainer
        every, last = t.spec.tcfg.save_every, t.state.step == t.total_steps
        if last and not t.spec.tcfg.keep_checkpoints:
            return
        if (every and t.state.step % every == 0) or last:
            checkpoint.save(t.spec, t.engine, t.state, t.sampler, t.callback_states())
