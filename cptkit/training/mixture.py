"""Mixture controllers: one interface, chosen by ``train.mixture`` (SPEC §9a–d).

A controller holds the current domain weights and, when it is dynamic, asks for per-domain
eval losses at its interval and updates the weights with the pure functions of
:mod:`cptkit.mixing`:

* ``static``: fixed weights (``train.weights``, the stream's first stage, or ``tokens``).
* ``staged``: follows the stream's plan (stages, upsampling tail, curriculum) exactly.
* ``topic_ppl``: Llama-3-SynE: every ``round_tokens``, ``topic_ppl_update`` on per-domain PPL
  (within each parent, e.g. topics within a language, so the language ratio stays fixed).
* ``velocitune``: every ``interval_steps``, ``velocitune_update`` with ℓ_init measured at step 0.
* ``dbl``: every ``interval_steps``, ``dbl_update`` against the target losses.
"""

from __future__ import annotations

import math
from typing import Any

from cptkit import mixing
from cptkit.errors import CptkitError

MIXTURES = ("static", "staged", "topic_ppl", "velocitune", "dbl")


class Controller:
    """Base: static weights. ``weights is None`` means "follow the stream's plan"."""

    name = "static"
    dynamic = False

    def __init__(self, domains: list[str], weights: dict[str, float] | None):
        self.domains = domains
        self.weights = mixing.normalize(weights) if weights is not None else None
        self.updates = 0

    def wants_eval(self, step: int, tokens: int) -> bool:
        """Whether per-domain eval losses are needed before optimizer step ``step``."""
        return False

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        """Consume eval losses; returns what to log (velocities, PPL changes...)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = state["weights"]
        self.updates = int(state["updates"])


class Staged(Controller):
    name = "staged"

    def __init__(self, domains: list[str]):
        super().__init__(domains, None)


class TopicPPL(Controller):
    name = "topic_ppl"
    dynamic = True

    def __init__(self, domains: list[str], weights: dict[str, float], parents: dict[str, str],
                 round_tokens: float, alpha: float, within_parent: bool = True):
        super().__init__(domains, weights)
        if round_tokens <= 0:
            raise CptkitError(f"train.topic_ppl.round_tokens={round_tokens}: must be > 0")
        self.parents, self.round_tokens, self.alpha = parents, float(round_tokens), float(alpha)
        self.within_parent = within_parent
        self.prev: dict[str, float] | None = None
        self.next_round = 0.0

    def wants_eval(self, step: int, tokens: int) -> bool:
        return tokens >= self.next_round

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        ppl = {d: math.exp(losses[d]) for d in self.domains}
        self.next_round = (math.floor(tokens / self.round_tokens) + 1) * self.round_tokens
        if self.prev is None:
            self.prev = ppl
            return {"ppl": ppl}
        assert self.weights is not None
        groups: dict[str, list[str]] = {}
        for d in self.domains:
            groups.setdefault(self.parents[d] if self.within_parent else "", []).append(d)
        new: dict[str, float] = {}
        for members in groups.values():
            mass = sum(self.weights[d] for d in members)
            if mass <= 0:
                new.update({d: 0.0 for d in members})
                continue
            upd = mixing.topic_ppl_update({d: self.weights[d] for d in members}, {d: self.prev[d] for d in members},
                                          {d: ppl[d] for d in members}, alpha=self.alpha)
            new.update({d: mass * upd[d] for d in members})
        self.weights = mixing.normalize(new)
        self.prev = ppl
        self.updates += 1
        return {"ppl": ppl}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"prev": self.prev, "next_round": self.next_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prev, self.next_round = state["prev"], float(state["next_round"])


class Velocitune(Controller):
    name = "velocitune"
    dynamic = True

    def __init__(self, domains: list[str], weights: dict[str, float], targets: dict[str, float] | None,
                 interval_steps: int, use_target: bool = True):
        super().__init__(domains, weights)
        if use_target:
            if not targets:
                raise CptkitError("train.mixture=velocitune needs target losses: train.velocitune.targets, "
                                  "train.velocitune.targets_file, or a proxy run (train.velocitune.proxy=true)")
            missing = [d for d in domains if d not in targets]
            if missing:
                raise CptkitError(f"velocitune targets: domain {missing[0]!r} has no target loss")
        if interval_steps <= 0:
            raise CptkitError(f"train.velocitune.interval_steps={interval_steps}: must be > 0")
        self.targets = {d: float(targets[d]) for d in domains} if targets else None
        self.interval, self.use_target = int(interval_steps), use_target
        self.init: dict[str, float] | None = None

    def wants_eval(self, step: int, tokens: int) -> bool:
        return self.init is None or (step > 0 and step % self.interval == 0)

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        cur = {d: losses[d] for d in self.domains}
        if self.init is None:
            self.init = cur
            return {"init_loss": cur}
        assert self.weights is not None
        v = mixing.velocities(self.init, self.targets, cur, use_target=self.use_target)
        self.weights = mixing.velocitune_update(self.weights, self.init, self.targets, cur, use_target=self.use_target)
        self.updates += 1
        return {"velocity": v}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"init": self.init}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.init = state["init"]


class DBL(Controller):
    name = "dbl"
    dynamic = True

    def __init__(self, domains: list[str], weights: dict[str, float], targets: dict[str, float] | None,
                 interval_steps: int, eta: float, smoothing: float, clip: bool):
        super().__init__(domains, weights)
        if not targets or any(d not in targets for d in domains):
            raise CptkitError("train.mixture=dbl needs a target loss per domain (train.velocitune.targets "
                              "or train.velocitune.targets_file)")
        if interval_steps <= 0:
            raise CptkitError(f"train.dbl.interval_steps={interval_steps}: must be > 0")
        self.targets = {d: float(targets[d]) for d in domains}
        self.interval, self.eta, self.smoothing, self.clip = int(interval_steps), float(eta), float(smoothing), clip

    def wants_eval(self, step: int, tokens: int) -> bool:
        return step > 0 and step % self.interval == 0

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        assert self.weights is not None
        cur = {d: losses[d] for d in self.domains}
        self.weights = mixing.dbl_update(self.weights, self.targets, cur, eta=self.eta, smoothing=self.smoothing,
                                         clip=self.clip)
        self.updates += 1
        return {"distance": {d: cur[d] - self.targets[d] for d in self.domains}}
