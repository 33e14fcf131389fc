"""The run's mixture from its :class:`~cptkit.mixtures.options.MixtureOptions`: weights as written (a
mapping, uniform, tokens, stage), and the stage-following :class:`StageMixture` with the controller
``train.mixture`` names acting within it (found in :data:`CONTROLLERS`, built by its ``from_options``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from cptkit.core.errors import CptkitError
from cptkit.mixtures.controller import CONTROLLERS, ControllerContext
from cptkit.mixtures.options import MixtureOptions, Weights
from cptkit.mixtures.rules import plan_average, static_from_average
from cptkit.mixtures.stages import RunStage, StageMixture, run_stages

if TYPE_CHECKING:
    from cptkit.mixtures.stream import Stream


def resolve_weights(spec: Weights | None, stream: Stream, default: str,
                    stage: RunStage | None = None) -> dict[str, float]:
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


def averaged_weights(path: str, stream: Stream) -> dict[str, float]:
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


def make_controller(opts: MixtureOptions, stream: Stream, proxy: bool, run_sequences: int | None = None,
                    budget_tokens: float = 0.0) -> StageMixture:
    """The run's mixture: the stream's stages in order, a dynamic controller acting within them.

    ``static`` follows the stages with their weights (``train.weights`` = a mapping, ``tokens``,
    ``uniform`` or ``average`` gives one mixture for the whole run instead); ``static_avg`` is one
    mixture at another run's averaged weights (``train.weights_from``); ``staged`` follows the plan row by
    row; ``topic_ppl``/``velocitune``/``dbl`` act in ``train.controller_stages`` (default all),
    restarting in each from ``train.init_weights`` over the stage's domains (null: the rule's
    ``default_init``), as does a rule registered by name or ``package.module:Class``. The proxy of
    Velocitune trains with token-share weights (``init_weights``) throughout.
    """
    kind = "static" if proxy else opts.mixture  # a STATIC_MIXTURES name, a registered rule or package.module:Class
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
        return StageMixture(whole(resolve_weights(opts.init_weights, stream, "tokens"), "proxy"))
    if kind == "static_avg":
        return StageMixture(whole(averaged_weights(str(opts.weights_from), stream), "static_avg"))
    if kind == "static":
        if opts.weights is None or opts.weights in ("stages", "stream"):
            return StageMixture(run_stages(stream.meta["stages"], doms, total, n_run))
        return StageMixture(whole(resolve_weights(opts.weights, stream, "stage"), "all"))
    stages = run_stages(stream.meta["stages"], doms, total, n_run)
    if kind == "staged":
        return StageMixture(stages, exact_plan=True)
    rule = CONTROLLERS.get(kind)  # a registered rule, or a plugin package.module:Class
    first = dict.fromkeys(doms, 1.0)  # placeholder: entering a stage it acts in sets the start weights
    ctl = rule.from_options(opts, ControllerContext(doms, first, stream.parents, budget_tokens))
    return StageMixture(stages, ctl, opts.controller_stages,
                        lambda st: resolve_weights(opts.init_weights, stream, rule.default_init, st))
