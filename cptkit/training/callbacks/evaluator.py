"""The forgetting curves' points as a callback: per-domain held-out losses and few-shot task scores
every ``train.eval_every`` steps, before step 1 and after the last (``metrics.jsonl``)."""

from __future__ import annotations

from cptkit.training.callbacks import Callback


class EvaluatorCallback(Callback):
    priority = 300  # after the mixture: a step evaluates once, and the mixture's evaluation comes first
    name = "evaluator"

    def pre_step(self) -> None:
        t = self.trainer
        every = t.spec.tcfg.eval_every
        if "eval_loss" in t.step_metrics or not every or t.state.step % every:  # the mixture evaluated this step
            return
        t.add_metrics({**t.evals.point(t.engine.module, t.tokenizer, initial=t.state.step == 0),
                       "eval_tokens": t.state.tokens})

    def post_train(self) -> None:
        t = self.trainer
        if t.log.metrics is not None and t.spec.tcfg.eval_every:  # the end point of the forgetting curves
            t.log.eval_point(t.state, t.evals.point(t.engine.module, t.tokenizer))
