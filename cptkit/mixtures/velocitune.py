"""Velocitune target losses (seed 001 §2.1, App. B): the proxy run and the targets file.

The proxy trains the model on part of the data with the default (token-share) weights and the
real run's LR schedule, evaluates a checkpoint every ``proxy_every`` of the real run's steps on
the full held-out set, fits L(D) = E + B/D^β per domain and extrapolates to the REAL run's token
budget. It stops as soon as the prediction moves less than σ between the previous checkpoint
set and the current one, or at ``proxy_fraction`` of the real run (then the file says
``converged: false``). The targets file records the budget, the domains and the stream; a run
that uses it checks them (:func:`load_targets_file`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.mixtures.options import VelocituneConfig
from cptkit.mixtures.rules import ScalingLawError, TargetEstimator


class ProxyRun:
    """When to evaluate, when to stop, and what to write for a Velocitune proxy run."""

    def __init__(self, vcfg: VelocituneConfig, full_steps: int, tokens_per_step: int):
        self.full_steps = int(full_steps)
        self.budget = float(full_steps * tokens_per_step)
        frac = float(vcfg.proxy_fraction)
        if not 0 < frac <= 1:
            raise CptkitError(f"train.velocitune.proxy_fraction={frac}: must be in (0, 1]")
        every = float(vcfg.proxy_every)
        if every <= 0:
            raise CptkitError(f"train.velocitune.proxy_every={every}: must be > 0")
        self.every = max(1, round(every * full_steps)) if every < 1 else int(every)
        self.max_steps = max(1, round(full_steps * frac))
        self.min_checkpoints = int(vcfg.proxy_min_checkpoints)
        possible = self.max_steps // self.every
        if self.min_checkpoints < 4:
            raise CptkitError("train.velocitune.proxy_min_checkpoints must be ≥ 4 (the previous checkpoint set "
                              "needs 3 points for a scaling-law fit)")
        if possible < self.min_checkpoints:
            raise CptkitError(f"velocitune proxy: a checkpoint every {self.every} steps gives only {possible} "
                              f"checkpoints within proxy_fraction={frac:g} of {full_steps} steps; need "
                              f"{self.min_checkpoints} (lower train.velocitune.proxy_every)")
        self.sigma = float(vcfg.sigma)
        if not self.sigma > 0:
            raise CptkitError(f"train.velocitune.sigma={vcfg.sigma}: must be > 0")
        self.eval_docs = int(vcfg.init_eval_docs)
        self.estimator = TargetEstimator(self.budget, self.sigma, self.min_checkpoints)

    def is_checkpoint(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def add(self, tokens: float, losses: dict[str, float]) -> bool:
        """Record a checkpoint; True when the targets have settled (stop the proxy)."""
        try:
            return self.estimator.add(tokens, losses)
        except ScalingLawError as e:
            raise CptkitError(f"velocitune proxy at {tokens:.0f} tokens: {e}") from None

    def result(self, domains: list[str], stream_path: str, steps: int) -> dict[str, Any]:
        est = self.estimator
        if not est.targets:
            raise CptkitError(f"velocitune proxy stopped after {len(est.checkpoints)} checkpoints: a fit needs 3")
        return {
            "targets": est.targets, "budget_tokens": self.budget, "real_run_steps": self.full_steps,
            "proxy_steps": steps, "domains": list(domains), "stream": stream_path,
            "converged": bool(est.converged), "change": est.change if math.isfinite(est.change) else None,
            "sigma": self.sigma, "history": [{"checkpoints": n, "change": c} for n, c in est.history],
            "laws": {d: {"E": law.E, "B": law.B, "beta": law.beta, "rmse": law.rmse} for d, law in est.laws.items()},
            "checkpoints": [{"tokens": t, "losses": v} for t, v in est.checkpoints],
        }


def load_targets_file(path: str | Path, budget_tokens: float, domains: list[str], allow_budget_mismatch: bool,
                      allow_unconverged: bool) -> dict[str, float]:
    """Targets of a proxy run, checked against this run's token budget and domains."""
    p = Path(path)
    if not p.exists():
        raise CptkitError(f"train.velocitune.targets_file={p}: no such file (run with train.velocitune.proxy=true)")
    try:
        data = json.loads(p.read_text())
        targets = {str(k): float(v) for k, v in data["targets"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CptkitError(f"{p}: not a Velocitune targets file ({e})") from None
    want = data.get("budget_tokens")
    if want is None or abs(float(want) - budget_tokens) > 0.5:
        msg = (f"{p}: targets were extrapolated to {want} tokens but this run trains {budget_tokens:.0f}; run the "
               "proxy with this run's train.max_steps/budget_tokens/batch settings, or pass "
               "train.velocitune.allow_budget_mismatch=true")
        if not allow_budget_mismatch:
            raise CptkitError(msg)
        log.warning("%s", msg.replace("; run the proxy", " (allowed); run the proxy"))
    if data.get("converged") is False and not allow_unconverged:
        raise CptkitError(f"{p}: the proxy reached its proxy_fraction before the targets moved less than "
                          f"sigma={data.get('sigma')} (last change {data.get('change')}); raise "
                          "train.velocitune.proxy_fraction or sigma, or pass train.velocitune.allow_unconverged=true")
    missing = [d for d in domains if d not in targets]
    if missing:
        raise CptkitError(f"{p}: no target for domain {missing[0]!r} (the proxy ran on another stream?)")
    return targets


def load_targets(vcfg: VelocituneConfig, budget_tokens: float = 0.0, domains: list[str] | None = None) -> dict[str, float]:
    """Velocitune/DBL targets: ``targets`` over a proxy's ``targets_file`` (checked against this run)."""
    targets = {str(k): float(v) for k, v in (vcfg.targets or {}).items()}  # targets: Any, as written
    if vcfg.targets_file:
        from_file = load_targets_file(vcfg.targets_file, budget_tokens, [] if targets else list(domains or []),
                                      vcfg.allow_budget_mismatch, vcfg.allow_unconverged)
        targets = {**from_file, **targets}
    return targets
