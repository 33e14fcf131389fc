"""Mixture controllers: one interface, chosen by ``train.mixture`` (SPEC §9a–d).

A controller holds the current domain weights and, when it is dynamic, asks for per-domain
eval losses at its interval and updates the weights with the pure functions of
:mod:`cptkit.mixtures.rules`:

* ``static``: each stage's weights in turn (default), or one mixture (``train.weights``).
* ``static_avg``: one mixture at another run's time-averaged weights (its ``avg_weights.json``,
  ``train.weights_from``): the control of a dynamic rule (Velocitune §3.4's "reweighted" ratios).
* ``staged``: follows the stream's plan (stages, upsampling tail, curriculum) row by row.
* ``topic_ppl``: Llama-3-SynE: every ``round_tokens``, ``topic_ppl_update`` on per-domain PPL
  (within each parent, e.g. topics within a language, so the language ratio stays fixed).
* ``velocitune``: every ``interval_steps``, ``velocitune_update`` with ℓ_init measured before
  step 0 on the full held-out set and ℓ_t on a subset (§2.1).
* ``dbl``: every ``interval_steps``, ``dbl_update`` against the target losses.

The rules are registered by name in :data:`CONTROLLERS` (``train.mixture``), which also loads a
rule of your own, ``package.module:Class``. Each builds itself from the run's
:class:`~cptkit.mixtures.options.MixtureOptions` (:meth:`Controller.from_options`).

A dynamic controller acts within a stage (:mod:`cptkit.mixtures.stages`): ``enter_stage``
restricts it to the stage's domains (``active``) and its start weights; updates touch only
those domains, the others keep weight 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.registry import Registry
from cptkit.mixtures import rules as mixing
from cptkit.mixtures.options import MixtureOptions
from cptkit.mixtures.velocitune import load_targets


@dataclass(frozen=True)
class ControllerContext:
    """What a controller is built with beside the options: the stream's domains (in order), its start
    weights (a placeholder: entering a stage it acts in sets them), each domain's parent, and the
    run's token budget (Velocitune's target files are checked against it)."""

    domains: list[str]
    weights: dict[str, float]
    parents: dict[str, str]
    budget_tokens: float = 0.0


class Controller:
    """Base: fixed weights over ``domains``; the dynamic controllers below update them."""

    name = "static"
    dynamic = False
    needs_init = False  # wants an evaluation before step 0 even outside its stages
    default_init = "stage"  # its start weights in a stage when train.init_weights is null

    def __init__(self, domains: list[str], weights: dict[str, float] | None):
        self.domains = domains
        self.active = list(domains)
        self.weights = mixing.normalize(weights) if weights is not None else None
        self.updates = 0

    @classmethod
    def from_options(cls, opts: MixtureOptions, ctx: ControllerContext) -> Controller:
        """The rule ``train.mixture`` names, built for this run: ``cls(domains, weights)`` (a rule of
        your own with its class defaults); a rule with settings overrides it to read its section of
        ``opts``."""
        return cls(ctx.domains, ctx.weights)

    def enter_stage(self, domains: list[str], weights: dict[str, float]) -> None:
        """Act on ``domains`` only (a stage's domain set), starting from ``weights`` (0 elsewhere)."""
        keep = set(domains)
        self.active = [d for d in self.domains if d in keep]
        w = {d: (float(weights.get(d, 0.0)) if d in keep else 0.0) for d in self.domains}
        if sum(w.values()) <= 0:
            raise CptkitError(f"mixture start weights put no mass on the stage's domains {', '.join(self.active)}")
        self.weights = mixing.normalize(w)

    def _set_active(self, new: dict[str, float]) -> None:
        """New weights for the active domains; the others stay 0."""
        self.weights = mixing.normalize({d: new.get(d, 0.0) if d in new else 0.0 for d in self.domains})

    def wants_eval(self, step: int, tokens: int) -> bool:
        """Whether per-domain eval losses are needed before optimizer step ``step``."""
        return False

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        """Consume eval losses; returns what to log (velocities, PPL changes...)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "updates": self.updates, "active": self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = state["weights"]
        self.updates = int(state["updates"])
        self.active = list(state.get("active") or self.domains)


# the dynamic rules by ``train.mixture`` name; ``package.module:Class`` loads a Controller subclass of
# your own; either is built by ``Class.from_options(opts, ctx)``
CONTROLLERS: Registry[type[Controller]] = Registry("train.mixture", base=Controller)


@CONTROLLERS.register("topic_ppl")
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

    @classmethod
    def from_options(cls, opts: MixtureOptions, ctx: ControllerContext) -> TopicPPL:
        tp = opts.topic_ppl
        round_tokens = tp.round_fraction * ctx.budget_tokens if tp.round_fraction is not None else tp.round_tokens
        return cls(ctx.domains, ctx.weights, ctx.parents, round_tokens, tp.alpha, tp.within_parent)

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
        for d in self.active:
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
        self._set_active(new)
        self.prev = ppl
        self.updates += 1
        return {"ppl": ppl}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"prev": self.prev, "next_round": self.next_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prev, self.next_round = state["prev"], float(state["next_round"])


@CONTROLLERS.register("velocitune")
class Velocitune(Controller):
    name = "velocitune"
    dynamic = True
    default_init = "uniform"

    def __init__(self, domains: list[str], weights: dict[str, float], targets: dict[str, float] | None,
                 interval_steps: int, use_target: bool = True, learnt_guard: bool = False,
                 init_eval_docs: int = 0, eval_docs: int | None = None):
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
        self.interval, self.use_target, self.learnt_guard = int(interval_steps), use_target, learnt_guard
        self.init_docs, self.subset_docs = int(init_eval_docs), eval_docs
        self.init: dict[str, float] | None = None

    @classmethod
    def from_options(cls, opts: MixtureOptions, ctx: ControllerContext) -> Velocitune:
        v = opts.velocitune
        return cls(ctx.domains, ctx.weights, load_targets(v, ctx.budget_tokens, ctx.domains), v.interval_steps,
                   v.use_target, v.learnt_guard, v.init_eval_docs, v.eval_docs)

    @property
    def needs_init(self) -> bool:  # type: ignore[override]
        return self.init is None

    def wants_eval(self, step: int, tokens: int) -> bool:
        return self.init is None or (step > 0 and step % self.interval == 0)

    def eval_docs(self, step: int, default: int) -> int:
        """ℓ_init on the full held-out set (``init_eval_docs``, 0 = all); ℓ_t on a subset S' (§2.1)."""
        if self.init is None:
            return self.init_docs
        return int(self.subset_docs) if self.subset_docs is not None else int(default)

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        if self.init is None:
            self.init = {d: losses[d] for d in self.domains}
            return {"init_loss": self.init}
        assert self.weights is not None
        act = self.active
        cur = {d: losses[d] for d in act}
        init = {d: self.init[d] for d in act}
        tgt = {d: self.targets[d] for d in act} if self.targets else None
        v = mixing.velocities(init, tgt, cur, use_target=self.use_target, learnt_guard=self.learnt_guard)
        self._set_active(mixing.velocitune_update({d: self.weights[d] for d in act}, init, tgt, cur,
                                                  use_target=self.use_target, learnt_guard=self.learnt_guard))
        self.updates += 1
        return {"velocity": v}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"init": self.init}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.init = state["init"]


@CONTROLLERS.register("dbl")
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

    @classmethod
    def from_options(cls, opts: MixtureOptions, ctx: ControllerContext) -> DBL:
        d = opts.dbl
        return cls(ctx.domains, ctx.weights, load_targets(opts.velocitune, ctx.budget_tokens, ctx.domains),
                   d.interval_steps, d.eta, d.smoothing, d.clip)

    def wants_eval(self, step: int, tokens: int) -> bool:
        return step > 0 and step % self.interval == 0

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        assert self.weights is not None
        act = self.active
        cur = {d: losses[d] for d in act}
        self._set_active(mixing.dbl_update({d: self.weights[d] for d in act}, {d: self.targets[d] for d in act}, cur,
                                           eta=self.eta, smoothing=self.smoothing, clip=self.clip))
        self.updates += 1
        return {"distance": {d: cur[d] - self.targets[d] for d in act}}


def domain_eval(model, tokenizer, records: list[dict], max_docs: int, max_tokens: int,
                seq_len: int, cache: Any = None) -> tuple[dict[str, float], dict[str, float]]:
    """Per-domain token-weighted eval loss on the first ``max_docs`` held-out docs per domain (0: all),
    and its standard error over those docs (logged next to the loss; the rules use the loss only).
    ``cache``: an :class:`~cptkit.training.evaluation.InitEvalCache` (the untrained model only)."""
    from cptkit.models.scoring import group_losses  # deferred: numpy, torch

    def compute() -> dict[str, dict[str, float]]:
        was_training = model.training
        model.eval()
        try:
            return group_losses(model, tokenizer, records, group_by="domain", max_docs_per_group=int(max_docs) or None,
                                max_length=seq_len, max_tokens=int(max_tokens))
        finally:
            model.train(was_training)

    res = cache.group_losses(compute, int(max_docs) or None) if cache is not None else compute()
    return ({d: float(v["loss"]) for d, v in res.items()},
            {d: (None if math.isnan(v["se"]) else float(v["se"])) for d, v in res.items()})


def domain_losses(model, tokenizer, records: list[dict], max_docs: int, max_tokens: int,
                  seq_len: int) -> dict[str, float]:
    """Per-domain token-weighted eval loss (:func:`domain_eval` without the standard errors)."""
    return domain_eval(model, tokenizer, records, max_docs, max_tokens, seq_len)[0]


# the train.mixture names that are schedules of the stream's stages, not rules (mixtures/factory.py)
STATIC_MIXTURES = ("static", "static_avg", "staged")


def mixture_names() -> list[str]:
    """Every ``train.mixture`` name: the schedules, then the rules registered now (or package.module:Class)."""
    return [*STATIC_MIXTURES, *CONTROLLERS.names()]
