"""Effects over seeds, as pure functions: mean ± standard error, bootstrap intervals, and a verdict
fixed before any run is looked at.

An effect is a per-seed difference (an arm against its baseline, paired by seed). It *holds* when
its interval excludes zero in the expected direction, *contradicts* when it excludes zero the other
way, and is *inconclusive* otherwise. The default interval is mean ± 2 standard errors (about 95%
for a normal mean); :func:`bootstrap_ci` gives a percentile interval where the normal one is doubtful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

HOLDS, CONTRADICTS, INCONCLUSIVE = "holds", "contradicts", "inconclusive at this scale"


def mean_metrics(items: list[dict], names: list[str]) -> dict[str, float | None]:
    """Per metric name: the mean over ``items`` and its standard error (``NAME_stderr``; 0 for one item,
    None for none): the task scores of :mod:`cptkit.eval.tasks`, lm-eval's ``mean`` and ``stderr``."""
    out: dict[str, float | None] = {}
    for m in names:
        if not items:
            out[m], out[f"{m}_stderr"] = None, None
            continue
        mean, se = mean_se([it[m] for it in items])
        out[m], out[f"{m}_stderr"] = mean, 0.0 if len(items) == 1 else se
    return out


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample SD / sqrt(n)); SE is NaN for a single value."""
    n = len(xs)
    if n == 0:
        raise ValueError("mean_se of no values")
    m = sum(xs) / n
    if n == 1:
        return m, math.nan
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def bootstrap_ci(xs: Sequence[float], level: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``xs`` (deterministic in ``seed``; vectorised, in
    blocks of resamples so that memory stays near 4 MB whatever ``len(xs)``)."""
    import numpy as np

    if not len(xs):
        raise ValueError("bootstrap_ci of no values")
    x = np.asarray(xs, dtype=np.float64)
    n = len(x)
    rng = np.random.default_rng(seed)
    block = max(1, 500_000 // n)
    means = np.concatenate([x[rng.integers(0, n, size=(min(block, resamples - i), n))].mean(axis=1)
                            for i in range(0, resamples, block)])
    means.sort()
    lo = means[int(math.floor((1 - level) / 2 * (resamples - 1)))]
    hi = means[int(math.ceil((1 + level) / 2 * (resamples - 1)))]
    return float(lo), float(hi)


@dataclass(frozen=True)
class Effect:
    """A paired effect over seeds: its mean, standard error, interval and verdict."""

    mean: float
    se: float
    lo: float
    hi: float
    n: int
    verdict: str

    def text(self, digits: int = 3) -> str:
        se = "n/a" if math.isnan(self.se) else f"{self.se:.{digits}f}"
        return f"{self.mean:+.{digits}f} ± {se}"


def effect(diffs: Sequence[float], expect: int, z: float = 2.0) -> Effect:
    """The verdict on per-seed differences ``diffs`` whose expected sign is ``expect`` (+1 or -1).

    Interval: mean ± ``z``·SE. With one seed there is no error bar, so nothing can hold."""
    if expect not in (1, -1):
        raise ValueError("expect must be +1 or -1")
    m, se = mean_se(diffs)
    if math.isnan(se):
        return Effect(m, se, math.nan, math.nan, len(diffs), INCONCLUSIVE)
    lo, hi = m - z * se, m + z * se
    if lo > 0 or hi < 0:
        verdict = HOLDS if (m > 0) == (expect > 0) else CONTRADICTS
    else:
        verdict = INCONCLUSIVE
    return Effect(m, se, lo, hi, len(diffs), verdict)
