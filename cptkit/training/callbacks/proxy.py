"""The Velocitune proxy's stop as a callback (Velocitune App. B): held-out losses at the proxy's
checkpoints, and the run ends once its predicted targets settle; its state is those losses, replayed
into the proxy when the run resumes."""

from __future__ import annotations

from typing import Any

from cptkit.mixtures.velocitune import ProxyRun
from cptkit.training.callbacks import Callback


class ProxyStopCallback(Callback):
    priority = 100  # after the step's row, before its checkpoint (which saves the log)
    name = "proxy"

    def __init__(self, proxy_run: ProxyRun):
        self.proxy_run = proxy_run
        self.log: list[tuple[float, dict[str, float]]] = []

    def post_step(self, row: dict[str, Any]) -> None:
        t, proxy = self.trainer, self.proxy_run
        if not proxy.is_checkpoint(t.state.step):
            return
        losses, _ = t.evals.losses(t.engine.module, t.tokenizer, proxy.eval_docs)
        self.log.append((float(t.state.tokens), losses))
        if proxy.add(t.state.tokens, losses):
            t.request_stop("the proxy's predicted targets settled")

    def state_dict(self) -> dict[str, Any]:
        return {"log": self.log}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.log = [(float(tk), dict(losses)) for tk, losses in state["log"]]
        for tk, losses in self.log:
            self.proxy_run.add(tk, losses)
