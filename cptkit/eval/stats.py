"""The one statistics module of cptkit: paired effects over seeds, Holm's correction, TOST, and the
verdicts that the CPT report (:mod:`cptkit.training.report`) and ``make reproduce``
(:mod:`cptkit.eval.reproduce`) print. Pure functions, no numpy/scipy needed but for the bootstrap.

A *comparison* is written down before its run: a metric, two arms, the sign the claim expects, a
minimum effect (in the metric's units), and its kind (``effect``: a directional claim; ``equivalence``:
a "no effect" claim with a TOST margin). After the run, the paired per-seed differences
``a − b`` decide it:

* **effect** (two-sided paired t at n − 1 degrees of freedom, Holm-adjusted over the family):
  *holds* when the adjusted p is below α and the (1 − α) interval lies beyond the minimum effect on the
  expected side (``lo ≥ δ`` for an expected rise, ``hi ≤ −δ`` for a fall: a one-sided t test against δ
  at α/2); *contradicts* when the adjusted p is below α and the interval lies beyond the minimum effect
  on the other side; *inconclusive* otherwise: a significant effect whose interval straddles δ is a
  direction, not a size that reaches the claim.
* **equivalence** (TOST with margin δ, Holm-adjusted): *holds* when the adjusted TOST p is below α,
  i.e. the (1 − 2α) t interval lies inside (−δ, δ); *contradicts* when the test against zero, adjusted
  by Holm over the same family (its p takes the TOST's place), rejects and the (1 − α) interval lies
  wholly outside (−δ, δ); *inconclusive* otherwise.
* An inconclusive verdict carries the design's *minimum detectable effect*
  (:func:`min_detectable_effect`, :func:`min_detectable_margin`): the smallest true difference (or TOST
  margin) it would have shown at 80% power, at the strictest Holm step (α/m), with the seeds' spread.
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
    once :func:`decide` has run over its family), verdict, and the test that gave it. ``mde``: for an
    inconclusive verdict, the smallest effect (or TOST margin) the design would have shown at 80% power."""

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
    mde: float = math.nan

    def text(self, digits: int = 3) -> str:
        se = "n/a" if math.isnan(self.se) else f"{self.se:.{digits}f}"
        doc = "" if math.isnan(self.doc_se) else f" (docs ± {self.doc_se:.{digits}f})"
        return f"{self.mean:+.{digits}f} ± {se}{doc}"

    def why(self, digits: int = 3) -> str:
        """What qualifies the verdict: its reason and, when inconclusive, the design's power."""
        mde = (f"the design's minimum detectable {'margin' if self.test.startswith('TOST') else 'effect'} "
               f"at 80% power: {self.mde:.{digits}f}" if not math.isnan(self.mde) else "")
        return "; ".join(x for x in (self.reason, mde) if x)

    def sentence(self, digits: int = 3) -> str:
        """``+0.120 ± 0.010, CI [+0.092, +0.148], p = 0.003 (paired t, 4 df, Holm over 3): holds``."""
        if self.verdict == NOT_TESTABLE:
            return f"{self.text(digits)}: {NOT_TESTABLE} ({self.reason})"
        p = "< 0.001" if self.p < 0.001 else f"= {self.p:.3f}"
        why = f"; {self.why(digits)}" if self.why(digits) else ""
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
    p = _p_zero(m, se, df)
    e = Effect(m, se, m - half, m + half, len(diffs), p, INCONCLUSIVE, test)
    return _effect_verdict(e, expect, min_effect, 1.0 - level)


def _p_zero(m: float, se: float, df: int) -> float:
    """Two-sided p of a paired t test against zero (0 when every seed has the same non-zero difference)."""
    return 2.0 * (1.0 - t_cdf(abs(m) / se, df)) if se > 0 else 0.0


def _beyond(lo: float, hi: float, sign: int, bound: float) -> bool:
    """Whether the interval [lo, hi] lies beyond ``bound`` on the side of ``sign`` (≥ δ or ≤ −δ)."""
    return lo >= bound if sign > 0 else hi <= -bound


def _effect_verdict(e: Effect, expect: int, min_effect: float, alpha: float, m: int = 1) -> Effect:
    if e.p < alpha:
        for sign, verdict in ((expect, HOLDS), (-expect, CONTRADICTS)):
            if _beyond(e.lo, e.hi, sign, min_effect):
                return replace(e, verdict=verdict, reason="", mde=math.nan)
    reason = ""
    if e.p < alpha and min_effect > 0:
        reason = (f"significant, but the interval does not clear the minimum effect {min_effect:g}"
                  f"{' (the point estimate does)' if abs(e.mean) >= min_effect else ''}")
    return replace(e, verdict=INCONCLUSIVE, reason=reason,
                   mde=min_detectable_effect(e.se, e.n, min_effect, alpha / m))


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
    return _tost_verdict(e, margin, alpha, _p_zero(m, se, df))


def _tost_verdict(e: Effect, margin: float, alpha: float, p_zero: float, m: int = 1) -> Effect:
    """A TOST's verdict from its (adjusted) p and its test against zero's (adjusted) ``p_zero``."""
    if e.p < alpha:
        return replace(e, verdict=HOLDS, mde=math.nan)
    half = t_ppf(1.0 - alpha / 2.0, e.n - 1) * e.se  # the (1 − α) interval, as a directional claim's
    lo, hi = e.mean - half, e.mean + half
    if p_zero < alpha and (lo >= margin or hi <= -margin):
        adjusted = ", Holm-adjusted" if m > 1 else ""
        return replace(e, verdict=CONTRADICTS, mde=math.nan,
                       reason=(f"nonzero (t test against 0: p = {p_zero:.3f}{adjusted}) with its {1 - alpha:.0%} "
                               f"interval [{lo:+.3g}, {hi:+.3g}] beyond ±{margin:g}"))
    return replace(e, verdict=INCONCLUSIVE, mde=min_detectable_margin(e.se, e.n, alpha / m))


def min_detectable_effect(se: float, n: int, min_effect: float = 0.0, alpha: float = ALPHA,
                          power: float = 0.8) -> float:
    """The smallest true difference that a directional claim on ``n`` seeds with this standard error
    would show to hold with probability ``power``: its (1 − α) interval clearing ``min_effect``, i.e.
    ``(mean − δ) / SE ≥ t(1 − α/2, n − 1)``, where ``(mean − δ) / SE`` follows a noncentral t. The seeds'
    SE stands for σ/√n (the plug-in of any power analysis)."""
    if n < 2 or not se > 0:
        return math.nan
    from scipy.optimize import brentq
    from scipy.stats import nct

    df, crit = n - 1, t_ppf(1.0 - alpha / 2.0, n - 1)
    nc = brentq(lambda d: nct.sf(crit, df, d) - power, 0.0, 100.0 + 10 * crit)
    return min_effect + nc * se


def min_detectable_margin(se: float, n: int, alpha: float = ALPHA, power: float = 0.8) -> float:
    """The smallest TOST margin that ``n`` seeds with this standard error would show equivalent with
    probability ``power`` when the true difference is 0: P(|mean| + t(1 − α, n − 1)·SE < δ), integrated
    over the sampling distribution of the SE (σ/√n · √(χ²/df))."""
    if n < 2 or not se > 0:
        return math.nan
    from scipy.integrate import quad
    from scipy.optimize import brentq
    from scipy.stats import chi2, norm

    df, crit = n - 1, t_ppf(1.0 - alpha, n - 1)

    def prob(margin: float) -> float:  # in units of σ/√n = se
        def inner(q: float) -> float:
            s = math.sqrt(q / df)
            room = margin - crit * s
            return (2.0 * norm.cdf(room) - 1.0) * chi2.pdf(q, df) if room > 0 else 0.0
        return quad(inner, 0.0, (margin / crit) ** 2 * df, limit=200)[0]

    return brentq(lambda d: prob(d) - power, 1e-6, 50.0 + 10 * crit) * se


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
    correction across the family (untestable members are not counted). An equivalence's "contradicts"
    is its test against zero, adjusted by Holm over the same family in the TOST's place."""
    raw = [tost(d, c.margin, alpha) if c.kind == "equivalence" else paired_t(d, c.expect, c.min_effect, 1 - alpha)
           for c, d in family]
    zero = [math.nan if e.verdict == NOT_TESTABLE else _p_zero(e.mean, e.se, e.n - 1) for e in raw]
    adjusted = holm([e.p for e in raw])
    adjusted_zero = holm(zero)
    m = sum(not math.isnan(p) for p in adjusted)
    out = []
    for (c, _), e, p, pz in zip(family, raw, adjusted, adjusted_zero, strict=True):
        if e.verdict == NOT_TESTABLE:
            out.append(e)
            continue
        e = replace(e, p=p, test=e.test + (f", Holm over {m}" if m > 1 else ""))  # the comparisons it adjusted
        out.append(_tost_verdict(e, c.margin, alpha, pz, m) if c.kind == "equivalence"
                   else _effect_verdict(e, c.expect, c.min_effect, alpha, m))
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
