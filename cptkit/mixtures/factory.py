"""The run's mixture from the ``train.*`` config: weights as written (a mapping, uniform, tokens,
stage), a dynamic controller's loss targets, and the stage-following :class:`StageMixture` with
the controller ``train.mixture`` names acting within it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cptkit.core.errors import CptkitError
from cptkit.mixtures.controller import CONTROLLERS, DBL, TopicPPL, Velocitune
from cptkit.mixtures.rules import plan_average, static_from_average
from cptkit.mixtures.stages import RunStage, StageMixture, run_stages
from cptkit.mixtures.velocitune import load_targets_file

if TYPE_CHECKING:
    from cptkit.training.config import TrainOptions, VelocituneConfig


def resolve_weights(spec: Any, stream, default: str, stage: Any = None) -> dict[str, float]:
    """Weights from config: a mapping, or uniform / tokens / stage / average (``stream``: the same).

    With a ``stage`` (a :class:`~cptkit.mixtures.stages.RunStage`), ``uniform`` and ``tokens``
    are over the stage's domains and ``stage`` is its weights; without one, over all domains
    and ``stage`` is the stream's first stage. ``stage:NAME``: the weights of the stream's stage NAME;
    ``average``: the stream's stages averaged over its plan (:func:`~cptkit.mixtures.rules.plan_average`).
    """
    spec = default if spec is None else spec
    doms = stage.domains if stage is not None else list(stream.domains)
    if spec == "average":
        stages = run_stages(stream.meta["stages"], list(stream.domains), int(stream.meta["total_sequences"]),
                            int(stream.meta["total_sequences"]))
        avg = plan_average([(st.end - st.start, st.weights) for st in stages])
        return {d: avg.get(d, 0.0) for d in stream.domains}
    if isinstance(spec, str) and spec.startswith("stage:"):
        named = {str(st["name"]): st for st in stream.meta["stages"]}
        if spec[6:] not in named:
            raise CptkitError(f"weights {spec!r}: the stream has no stage {spec[6:]!r} (it has {', '.join(named)})")
        return {d: float(named[spec[6:]]["weights"].get(d, 0.0)) for d in stream.domains}
    if isinstance(spec, str):
        if spec == "uniform":
            return {d: (1.0 / len(doms) if d in doms else 0.0) for d in stream.domains}
        if spec in ("stage", "stream", "stages"):
            return dict(stage.weights) if stage is not None else stream.stage_weights(0)
        if spec == "tokens":
            tw = stream.token_weights()
            return {d: (tw[d] if d in doms else 0.0) for d in stream.domains}
        raise CptkitError(f"weights {spec!r}: give a mapping or one of uniform, stage, stage:NAME, tokens, average")
    w = dict(spec)
    unknown = [k for k in w if k not in stream.index]
    if unknown:
        raise CptkitError(f"weights: unknown domain {unknown[0]!r}; the stream has {', '.join(stream.domains)}")
    return {d: float(w.get(d, 0.0)) for d in stream.domains}


def weights_file(path: str) -> Path:
    """The file ``train.weights_from`` names (a run's directory: its ``avg_weights.json``)."""
    p = Path(path)
    return p / "avg_weights.json" if p.is_dir() else p


def averaged_weights(path: str, stream) -> dict[str, float]:
    """``train.weights_from``: the time-averaged weights of another run (its ``avg_weights.json``, or the
    run's directory) as one static mixture over this stream's domains."""
    f = weights_file(path)
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
        return static_from_average(data["weights"], list(stream.domains))
    except FileNotFoundError:
        raise CptkitError(f"train.weights_from={path}: no {f.name} there (is the averaged run unfinished?)") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CptkitError(f"train.weights_from={f}: not a run's averaged weights for this stream: {e}") from None


def load_targets(vcfg: VelocituneConfig, budget_tokens: float = 0.0, domains: list[str] | None = None) -> dict[str, float]:
    """Velocitune/DBL targets: ``targets`` over a proxy's ``targets_file`` (checked against this run)."""
    targets = {str(k): float(v) for k, v in (vcfg.targets or {}).items()}  # targets: Any, as written
    if vcfg.targets_file:
        from_file = load_targets_file(vcfg.targets_file, budget_tokens, [] if targets else list(domains or []),
                                      vcfg.allow_budget_mismatch, vcfg.allow_unconverged)
        targets = {**from_file, **targets}
    return targets


def make_controller(tcfg: TrainOptions, stream, proxy: bool, run_sequences: int | None = None,
                    budget_tokens: float = 0.0):
    """The run's mixture: the stream's stages in order, a dynamic controller acting within them.

    ``static`` follows the stages with their weights (``train.weights`` = a mapping, ``tokens``,
    ``uniform`` or ``average`` gives one mixture for the whole run instead); ``static_avg`` is one
    mixture at another run's averaged weights (``train.weights_from``); ``staged`` follows the plan row by
    row; ``topic_ppl``/``velocitune``/``dbl`` act in ``train.controller_stages`` (default all),
    restarting in each from ``train.init_weights`` over the stage's domains. The proxy of
    Velocitune trains with token-share weights (``init_weights``) throughout.
    """
    kind = "static" if proxy else tcfg.mixture  # one of MIXTURES or package.module:Class (TrainOptions)
    total = int(stream.meta["total_sequences"])
    n_run = run_sequences or total
    doms = list(stream.domains)

    def whole(weights: dict[str, float], name: str) -> list[RunStage]:
        bad = [d for d, w in weights.items() if not w >= 0]
        if bad:
            raise CptkitError(f"train.weights: weight of {bad[0]!r} is {weights[bad[0]]}; weights must be >= 0")
        tot = sum(weights.values())
        if tot <= 0:
            raise CptkitError("train.weights put no mass on any domain")
        return [RunStage(name, 0, n_run, {d: w / tot for d, w in weights.items()})]

    if proxy:
        return StageMixture(whole(resolve_weights(tcfg.init_weights, stream, "tokens"), "proxy"))
    if kind == "static_avg":
        return StageMixture(whole(averaged_weights(str(tcfg.weights_from), stream), "static_avg"))
    if kind == "static":
        if tcfg.weights is None or tcfg.weights in ("stages", "stream"):
            return StageMixture(run_stages(stream.meta["stages"], doms, total, n_run))
        return StageMixture(whole(resolve_weights(tcfg.weights, stream, "stage"), "all"))
    stages = run_stages(stream.meta["stages"], doms, total, n_run)
    if kind == "staged":
        return StageMixture(stages, exact_plan=True)
    cs = [str(x) for x in tcfg.controller_stages] if tcfg.controller_stages is not None else None  # Any: as written
    default_init = "uniform" if kind == "velocitune" else "stage"
    first = dict.fromkeys(doms, 1.0)  # placeholder: entering a stage it acts in sets the start weights
    rule = CONTROLLERS.get(kind)  # a registered rule, or a plugin package.module:Class
    if rule is TopicPPL:
        tp = tcfg.topic_ppl
        round_tokens = tp.round_fraction * budget_tokens if tp.round_fraction is not None else tp.round_tokens
        ctl: Any = TopicPPL(doms, first, stream.parents, round_tokens, tp.alpha, tp.within_parent)
    elif rule is Velocitune:
        vcfg = tcfg.velocitune
        ctl = Velocitune(doms, first, load_targets(vcfg, budget_tokens, doms), vcfg.interval_steps, vcfg.use_target,
                         vcfg.learnt_guard, vcfg.init_eval_docs, vcfg.eval_docs)
    elif rule is DBL:
        ctl = DBL(doms, first, load_targets(tcfg.velocitune, budget_tokens, doms), tcfg.dbl.interval_steps,
                  tcfg.dbl.eta, tcfg.dbl.smoothing, tcfg.dbl.clip)
    else:
        ctl = rule(doms, first)
    return StageMixture(stages, ctl, cs, lambda st: resolve_weights(tcfg.init_weights, stream, default_init, st))
