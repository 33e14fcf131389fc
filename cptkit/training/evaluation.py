"""Held-out evaluation during training: a dynamic mixture's eval-and-update points, the
``train.eval_every`` points (per-domain losses and few-shot tasks, before step 1 and after the
last), and the Velocitune proxy's checkpoints."""

from __future__ import annotations

import time
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.training.state import RunSpec, TrainState


class EvalPoints:
    """The eval documents and tasks of a run and when to use them (``mix_s``: time spent on the mixture)."""

    def __init__(self, spec: RunSpec, controller: Any):
        from cptkit.training.metrics import load_eval_tasks

        tcfg, stream = spec.tcfg, spec.stream
        self.tcfg, self.seq_len = tcfg, spec.seq_len
        self.records = stream.eval_records()
        self.tasks = load_eval_tasks(tcfg.eval_tasks) if tcfg.eval_every and tcfg.eval_tasks else []
        self.mix_s = 0.0
        if controller.dynamic or spec.proxy or tcfg.eval_every > 0:
            have = {r["domain"] for r in self.records}
            missing = [d for d in stream.domains if d not in have]
            if missing:
                raise CptkitError(f"{stream.path}: no held-out eval documents for domain {missing[0]!r} "
                                  "(rebuild the stream with mix.eval_docs > 0)")

    def losses(self, model: Any, tokenizer: Any, docs: int | None) -> tuple[dict[str, float], dict[str, float]]:
        """Per-domain held-out loss and its standard error over documents."""
        from cptkit.mixtures.controller import domain_eval

        return domain_eval(model, tokenizer, self.records, docs, self.tcfg.eval_max_tokens, self.seq_len)

    def point(self, model: Any, tokenizer: Any) -> dict[str, Any]:
        """An ``eval_every`` point: per-domain losses and the few-shot tasks."""
        from cptkit.training.metrics import evaluate_point

        return evaluate_point(model, tokenizer, self.records, self.tcfg, self.seq_len, self.tasks)

    def before_step(self, model: Any, tokenizer: Any, controller: Any, state: TrainState,
                    on_update: Any) -> dict[str, Any]:
        """The eval of this step, if any: the controller's update (``on_update(info)``) or an
        ``eval_every`` point. Returns what the step's metrics line records of it."""
        tcfg = self.tcfg
        if controller.dynamic and controller.wants_eval(state.step, state.tokens):
            te = time.time()
            losses, ses = self.losses(model, tokenizer, controller.eval_docs(state.step, tcfg.eval_docs))
            info = {"eval_loss": losses, "eval_loss_se": ses, "eval_tokens": state.tokens,
                    **controller.update(state.step, state.tokens, losses)}
            on_update(info)
            self.mix_s += time.time() - te
            return info
        if tcfg.eval_every and state.step % tcfg.eval_every == 0:
            return {**self.point(model, tokenizer), "eval_tokens": state.tokens}
        return {}

    def proxy_checkpoint(self, model: Any, tokenizer: Any, proxy_run: Any, state: TrainState) -> bool:
        """A Velocitune proxy checkpoint after this step, if due; True once its targets settled."""
        if proxy_run is None or not proxy_run.is_checkpoint(state.step):
            return False
        losses, _ = self.losses(model, tokenizer, proxy_run.eval_docs)
        state.proxy_log.append((float(state.tokens), losses))
        return bool(proxy_run.add(state.tokens, losses))
