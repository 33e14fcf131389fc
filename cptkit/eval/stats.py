"""The one statistics module of cptkit: paired effects over seeds, Holm's correction, TOST, and the
verdicts that the CPT report (:mod:`cptkit.training.report`) and ``make reproduce``
(:mod:`cptkit.eval.reproduce`) print. Pure functions, no numpy/scipy needed but for the bootstrap.

A *comparison* is written down before its run: a metric, two arms, the sign the claim expects, a
minimum effect (in the metric's units), and its kind (``effect``: a directional claim; ``equivalence``:
a "no effect" claim with a TOST margin). After the run, the paired per-seed differences
``a − b`` decide it:

* **effect** (two-sided paired t at n − 1 degrees of freedom, Holm-adjusted over the family):
  *holds* when the adjusted p is below α, the mean has the expected sign, and ``|mean|`` reaches the
  minimum effect; *contradicts* when the adjusted p is below α and the mean has the other sign
  (and reaches the minimum effect); *inconclusive* otherwise.
* **equivalence** (TOST with margin δ, Holm-adjusted): *holds* when both one-sided tests reject,
  i.e. the (1 − 2α) t interval lies inside (−δ, δ); *contradicts* when the paired t test rejects zero
  and ``|mean| > δ``; *inconclusive* otherwise.
* *not testable here* when the design cannot tell: fewer than two seeds (no error bar), or
  differences that are zero on every seed (a measure that cannot move, e.g. a clamped quantity).
  The same non-zero difference on every seed is a certain effect (p = 0), decided as any other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

HOLDS, CONTRADICTS, INCONCLUSIVE, NOT_TESTABLE = "holds", "contradicts", "inconclusive", "not testable here"
VERDICTS = (HOLDS, CONTRADICTS, INCONCLUSIVE, NOT_TESTABLE)
ALPHA = 0.05


# --- descriptive ----------------------------------------------------------------------------------
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


def mean_metrics(items: list[dict], names: list[str]) -> dict[str, float | None]:
    """Per metric name: the mean over ``items`` and its standard error (``NAME_stderr``; 0 for one item,
    None for none): the task scores of :mod:`cptkit.eval.runner`, lm-eval's ``mean`` and ``stderr``."""
    out: dict[str, float | None] = {}
    for m in names:
        if not items:
            out[m], out[f"{m}_stderr"] = None, None
            continue
        mean, se = mean_se([it[m] for it in items])
        out[m], out[f"{m}_stderr"] = mean, 0.0 if len(items) == 1 else se
    return out


# --- Student's t, from the regularized incomplete beta function ---------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on :func:`t_cdf`; t_ppf(0.975, 2) = 4.303)."""
    if not 0.0 < p < 1.0:
        raise ValueError("t_ppf needs 0 < p < 1")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


# --- tests and verdicts --------------------------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    """One decided comparison: the paired differences' mean and SE, its interval, p value (Holm-adjusted
    once :func:`decide` has run over its family), verdict, and the test that gave it."""

    mean: float
    se: float
    lo: float
    hi: float
    n: int
    p: float
    verdict: str
    test: str
    reason: str = ""
    doc_se: float = math.nan  # the per-document sampling error, shown beside the seed SE

    def text(self, digits: int = 3) -> str:
        se = "n/a" if math.isnan(self.se) else f"{self.se:.{digits}f}"
        doc = "" if math.isnan(self.doc_se) else f" (docs ± {self.doc_se:.{digits}f})"
        return f"{self.mean:+.{digits}f} ± {se}{doc}"

    def sentence(self, digits: int = 3) -> str:
        """``+0.120 ± 0.010, CI [+0.092, +0.148], p = 0.003 (paired t, 4 df, Holm over 3): holds``."""
        if self.verdict == NOT_TESTABLE:
            return f"{self.text(digits)}: {NOT_TESTABLE} ({self.reason})"
        p = "< 0.001" if self.p < 0.001 else f"= {self.p:.3f}"
        why = f"; {self.reason}" if self.reason else ""
        return (f"{self.text(digits)}, CI [{self.lo:+.{digits}f}, {self.hi:+.{digits}f}], p {p} "
                f"({self.test}){why}: {self.verdict}")


def _untestable(diffs: Sequence[float], test: str) -> Effect | None:
    n = len(diffs)
    m, se = mean_se(diffs)
    if n < 2:
        return Effect(m, se, math.nan, math.nan, n, math.nan, NOT_TESTABLE, test, "one seed: no error bar")
    if se <= 1e-12 * max(1.0, abs(m)) and abs(m) <= 1e-12:
        return Effect(m, se, m, m, n, math.nan, NOT_TESTABLE, test,
                      "no difference and no spread on any seed: the measure did not move (e.g. clamped)")
    return None


def paired_t(diffs: Sequence[float], expect: int, min_effect: float = 0.0, level: float = 0.95) -> Effect:
    """A directional claim on paired per-seed differences: the two-sided t test at n − 1 df, its
    ``level`` interval, and the verdict for one comparison alone (:func:`decide` adjusts a family)."""
    if expect not in (1, -1):
        raise ValueError("expect must be +1 or -1")
    test = f"paired t, {len(diffs) - 1} df"
    if (bad := _untestable(diffs, test)) is not None:
        return bad
    m, se = mean_se(diffs)
    df = len(diffs) - 1
    half = t_ppf(0.5 + level / 2.0, df) * se
    p = 2.0 * (1.0 - t_cdf(abs(m) / se, df)) if se > 0 else 0.0  # the same difference on every seed
    e = Effect(m, se, m - half, m + half, len(diffs), p, INCONCLUSIVE, test)
    return _effect_verdict(e, expect, min_effect, 1.0 - level)


def _effect_verdict(e: Effect, expect: int, min_effect: float, alpha: float) -> Effect:
    if e.p >= alpha:
        return replace(e, verdict=INCONCLUSIVE, reason="")
    if abs(e.mean) < min_effect:
        return replace(e, verdict=INCONCLUSIVE, reason=f"significant, but under the minimum effect {min_effect:g}")
    return replace(e, verdict=HOLDS if (e.mean > 0) == (expect > 0) else CONTRADICTS, reason="")


def tost(diffs: Sequence[float], margin: float, alpha: float = ALPHA) -> Effect:
    """Two one-sided tests of |mean| < ``margin`` (equivalence) on paired per-seed differences; the
    interval is the (1 − 2α) t interval, p the larger one-sided p."""
    if margin <= 0:
        raise ValueError("a TOST margin must be positive")
    test = f"TOST ±{margin:g}, {len(diffs) - 1} df"
    if (bad := _untestable(diffs, test)) is not None:
        return bad
    m, se = mean_se(diffs)
    df = len(diffs) - 1
    if se == 0:
        p = 0.0 if abs(m) < margin else 1.0
    else:
        p = max(1.0 - t_cdf((m + margin) / se, df), t_cdf((m - margin) / se, df))
    half = t_ppf(1.0 - alpha, df) * se
    e = Effect(m, se, m - half, m + half, len(diffs), p, INCONCLUSIVE, test)
    return _tost_verdict(e, diffs, margin, alpha)


def _tost_verdict(e: Effect, diffs: Sequence[float], margin: float, alpha: float) -> Effect:
    if e.p < alpha:
        return replace(e, verdict=HOLDS)
    df = len(diffs) - 1
    p_zero = 2.0 * (1.0 - t_cdf(abs(e.mean) / e.se, df)) if e.se > 0 else 0.0
    if p_zero < alpha and abs(e.mean) > margin:
        return replace(e, verdict=CONTRADICTS, reason=(f"nonzero (t test against 0: p = {p_zero:.3f}, "
                                                            f"not Holm-adjusted) with its estimate beyond ±{margin:g}"))
    return replace(e, verdict=INCONCLUSIVE)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the input order (NaN stays NaN and is not counted)."""
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    m, out, running = len(idx), [math.nan] * len(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


@dataclass(frozen=True)
class Comparison:
    """One pre-registered comparison: ``metric(a) − metric(b)`` and what the claim expects of it."""

    metric: str
    a: str
    b: str
    expect: int = -1  # the expected sign of a − b (ignored by an equivalence)
    min_effect: float = 0.0  # |mean| that "holds" must also reach (metric units)
    kind: str = "effect"  # "effect" or "equivalence"
    margin: float = 0.0  # the TOST margin of an equivalence

    def __post_init__(self) -> None:
        if self.kind not in ("effect", "equivalence"):
            raise ValueError(f"comparison kind {self.kind!r}: use effect or equivalence")
        if self.kind == "equivalence" and self.margin <= 0:
            raise ValueError("an equivalence needs a positive margin")
        if self.kind == "effect" and self.expect not in (1, -1):
            raise ValueError("an effect needs expect +1 or -1")


def decide(family: Sequence[tuple[Comparison, Sequence[float]]], alpha: float = ALPHA) -> list[Effect]:
    """Decide a family of pre-registered comparisons on their paired per-seed differences, with Holm's
    correction across the family (untestable members are not counted)."""
    raw = [tost(d, c.margin, alpha) if c.kind == "equivalence" else paired_t(d, c.expect, c.min_effect, 1 - alpha)
           for c, d in family]
    adjusted = holm([e.p for e in raw])
    out = []
    for (c, d), e, p in zip(family, raw, adjusted, strict=True):
        if e.verdict == NOT_TESTABLE:
            out.append(e)
            continue
        e = replace(e, p=p, test=e.test + (f", Holm over {len(family)}" if len(family) > 1 else ""))
        out.append(_tost_verdict(e, d, c.margin, alpha) if c.kind == "equivalence"
                   else _effect_verdict(e, c.expect, c.min_effect, alpha))
    return out


def claim_verdict(effects: Sequence[Effect]) -> str:
    """A claim from its comparisons: contradicted if any is, holds if all hold, not testable if all are."""
    if effects and all(e.verdict == NOT_TESTABLE for e in effects):
        return NOT_TESTABLE
    if any(e.verdict == CONTRADICTS for e in effects):
        return CONTRADICTS
    if effects and all(e.verdict == HOLDS for e in effects):
        return HOLDS
    return INCONCLUSIVE


# --- resampling ----------------------------------------------------------------------------------
def bootstrap_ci(xs: Sequence[float], level: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``xs`` (deterministic in ``seed``; vectorised, in
    blocks of resamples so that memory stays near 4 MB whatever ``len(xs)``)."""
    import numpy as np  # deferred: numpy is not needed for the t-based verdicts

    if not len(xs):
        raise ValueError("bootstrap_ci of no values")
    x = np.asarray(xs, dtype=np.float64)
    n = len(x)
    rng = np.random.default_rng(seed)
    block = max(1, 500_000 // n)
    means = np.concatenate([x[rng.integers(0, n, size=(min(block, resamples - i), n))].mean(axis=1)
                            for i in range(0, resamples, block)])
    return _percentiles(means, level, resamples)


def _percentiles(means, level: float, resamples: int) -> tuple[float, float]:
    means.sort()
    lo = means[int(math.floor((1 - level) / 2 * (resamples - 1)))]
    hi = means[int(math.ceil((1 + level) / 2 * (resamples - 1)))]
    return float(lo), float(hi)


def hierarchical_bootstrap(per_seed_docs: Sequence[Sequence[float]], level: float = 0.95, resamples: int = 2000,
                           seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean paired difference, resampling seeds, then documents within each
    drawn seed (``per_seed_docs[s]``: seed s's per-document differences)."""
    import numpy as np  # deferred: numpy is not needed for the t-based verdicts

    groups = [np.asarray(d, dtype=np.float64) for d in per_seed_docs]
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("hierarchical_bootstrap needs documents for every seed")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for r in range(resamples):
        drawn = rng.integers(0, len(groups), size=len(groups))
        means[r] = np.mean([groups[s][rng.integers(0, len(groups[s]), size=len(groups[s]))].mean() for s in drawn])
    return _percentiles(means, level, resamples)


def doc_se(per_seed_docs: Sequence[Sequence[float]]) -> float:
    """The per-document standard error of the mean paired difference: each seed's documents' SE,
    pooled as the SE of the mean over seeds (sqrt(Σ SE_s²) / n_seeds). NaN with a seed of < 2 docs."""
    ses = [mean_se(d)[1] for d in per_seed_docs]
    if not ses or any(math.isnan(s) for s in ses):
        return math.nan
    return math.sqrt(sum(s * s for s in ses)) / len(ses)
