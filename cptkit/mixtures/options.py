"""The mixture's own settings: the dynamic rules' sections (``train.topic_ppl``, ``train.velocitune``,
``train.dbl``) and :class:`MixtureOptions`, everything the run's mixture and its controller are built
from (:func:`cptkit.mixtures.factory.make_controller`). Training holds them in its ``train.*`` config
and hands them over as one :class:`MixtureOptions` (``TrainOptions.mixture_options``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cptkit.core.config import check

#: ``train.weights`` / ``train.init_weights`` as written: ``{domain: w}`` or a name (uniform, tokens,
#: stage, stage:NAME, average; :func:`cptkit.mixtures.factory.resolve_weights`)
Weights = str | Mapping[str, float]


@dataclass
class TopicPPLConfig:
    round_tokens: float = 1e5  # R: tokens per adjustment round
    round_fraction: float | None = None  # R as a share of the run's tokens (overrides round_tokens); paper 40B/100B
    alpha: float = 0.4
    within_parent: bool = True  # adjust topics within their parent (language), keeping its share

    def __post_init__(self) -> None:
        frac = self.round_fraction
        check(frac is None or 0 < frac <= 1, "round_fraction", frac, "must be in (0, 1]")


@dataclass
class VelocituneConfig:
    interval_steps: int = 150  # m
    use_target: bool = True  # false: the ablation V = l_t / l_init
    learnt_guard: bool = False  # true: l_init <= l_target counts as learnt (V = 0) instead of Algorithm 1's ratio
    targets: Any = None  # target loss per domain {domain: loss}
    targets_file: str | None = None  # _velocitune_targets.json of a proxy run
    allow_budget_mismatch: bool = False  # use targets extrapolated to another token budget than this run's
    allow_unconverged: bool = False  # use targets whose proxy stopped at proxy_fraction before converging
    init_eval_docs: int = 0  # held-out docs per domain for l_init and the proxy's checkpoints (0: all)
    eval_docs: int | None = None  # the subset S' per domain for velocities (null: train.eval_docs)
    proxy: bool = False  # run the proxy: token-share weights, checkpoints until the targets settle, write targets
    proxy_fraction: float = 0.6  # the most of the real run's steps the proxy may train
    proxy_every: float = 0.05  # a checkpoint every this share of the real run's steps (or steps, if >= 1)
    proxy_min_checkpoints: int = 4
    sigma: float = 0.01  # stop when the predicted targets move less than this between checkpoint sets (App. B)


@dataclass
class DBLConfig:
    interval_steps: int = 150
    eta: float = 1.0
    smoothing: float = 1e-4
    clip: bool = True


@dataclass(frozen=True)
class MixtureOptions:
    """What the run's mixture is built from: the ``train.*`` settings of the same names, checked when
    the config was composed. A controller reads its own section in ``from_options``
    (:meth:`cptkit.mixtures.controller.Controller.from_options`)."""

    mixture: str = "static"  # a schedule (static, static_avg, staged), a registered rule or package.module:Class
    weights: Weights | None = None  # static: one mixture for the whole run (null, stages: each stage's weights)
    weights_from: str | None = None  # static_avg: a run's avg_weights.json (or its directory)
    init_weights: Weights | None = None  # a dynamic rule's start in each stage (null: the rule's default_init)
    controller_stages: list[str] | None = None  # the stages a dynamic rule acts in (null: all)
    topic_ppl: TopicPPLConfig = field(default_factory=TopicPPLConfig)
    velocitune: VelocituneConfig = field(default_factory=VelocituneConfig)
    dbl: DBLConfig = field(default_factory=DBLConfig)
