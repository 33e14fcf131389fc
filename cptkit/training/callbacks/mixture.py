"""The mixture as a callback: the stage each step starts in, a dynamic controller's held-out
evaluation and update, and ``weights.jsonl`` events (init, stage, update); its state is the
controller's, so a resumed run continues the same weights."""

from __future__ import annotations

import time
from typing import Any

from cptkit.training.callbacks import Callback


class MixtureCallback(Callback):
    priority = 400  # first: a stage is entered, and a controller updates, before anything else looks
    name = "mixture"

    def pre_train(self) -> None:
        t = self.trainer
        if t.state.step == 0 and t.mixture.weights is not None:
            self._event({"event": "init"})

    def pre_step(self) -> None:
        """Enter the stage of the step's first sequence; evaluate and update when the controller asks."""
        t = self.trainer
        mixture, state = t.mixture, t.state
        entered = mixture.begin_step(t.sampler.position)  # a stage starting with this step
        if entered:
            self._event({"event": "stage", "stage": entered})
        if not (mixture.dynamic and mixture.wants_eval(state.step, state.tokens)):
            return
        te = time.time()
        losses, ses = t.evals.losses(t.engine.module, t.tokenizer, mixture.eval_docs(state.step, t.spec.tcfg.eval_docs),
                                     initial=state.step == 0)
        info = {"eval_loss": losses, "eval_loss_se": ses, "eval_tokens": state.tokens,
                **mixture.update(state.step, state.tokens, losses)}
        self._event({"event": "update", **info})
        t.add_metrics(info)
        t.add_mixture_seconds(time.time() - te)

    def on_stage(self, stage: str) -> None:
        self._event({"event": "stage", "stage": stage})

    def _event(self, info: dict[str, Any]) -> None:
        t = self.trainer
        t.log.weights_event(t.state, t.mixture.weights, info)

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.mixture.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.mixture.load_state_dict(state)
