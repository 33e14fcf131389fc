"""The D-CPT Law and the critical mixture ratio, as pure functions (``cptkit plan``, docs/plan.md).

D-CPT Law (Que et al. 2024, arXiv 2406.01375, their preferred form L3):

    L(N, D, r) = E + A / N^α + B · r^η / D^β + C / (r + ε)^γ

N model parameters, D training tokens, r the domain share of the mixture. As in the paper each
loss is fitted on its own (the domain loss, and here each forgetting measure), by minimising a
Huber loss (δ = 1e-3) on the residuals of log-losses with L-BFGS from a grid of initialisations.
Two choices of cptkit's, stated in docs/plan.md: B and C are fitted with their sign free (from a
converged base a general loss *rises* with D at a high domain share, which B ≥ 0 cannot express;
on the domain loss they come out positive), and for each grid point of the exponents (β, η, γ, ε)
the linear constants (E, A, B, C) start at their least-squares values. With one model size the N
term is constant and folded into E (A = α = 0).

CMR (Gu et al. 2024, arXiv 2407.17467): the critical mixture ratio at T tokens is the largest
domain share whose general loss stays within a tolerance of the base model's; :func:`cmr` reads it
off a fitted law, :func:`cmr_curve` over a range of T.

Uncertainty: :func:`bootstrap` refits on runs drawn with replacement (seeded) and gives the
percentile interval of any prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Law", "Fit", "LawError", "PARAMS", "fit_law", "bootstrap", "cmr", "cmr_curve", "recommend", "HUBER_DELTA"]

PARAMS = ("E", "A", "alpha", "B", "beta", "eta", "C", "gamma", "eps")
HUBER_DELTA = 1e-3  # the paper's (Chinchilla's) δ on log-loss residuals
# the box the exponents are fitted in; a best fit that ends on an edge did not converge
BOUNDS = {"alpha": (1e-3, 2.0), "beta": (1e-3, 3.0), "eta": (1e-3, 5.0), "gamma": (1e-3, 5.0), "eps": (1e-4, 10.0)}
GRID = {"beta": (0.1, 0.4, 1.0), "eta": (0.3, 1.0), "gamma": (0.2, 1.0), "eps": (0.03, 0.3), "alpha": (0.1, 0.4)}
E_TOP = 10.0  # log E's range ends at log(E_TOP × the largest loss): see _Problem.e_top
GREEK = {"alpha": "α", "beta": "β", "eta": "η", "gamma": "γ", "eps": "ε"}


class LawError(ValueError):
    """The law cannot be fitted to these points; the message names the reason (and the constant)."""


@dataclass(frozen=True)
class Law:
    """One fitted D-CPT law; ``A = alpha = 0``: one model size (the N term folded into E)."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    eta: float
    C: float
    gamma: float
    eps: float

    def __call__(self, D: np.ndarray | float, r: np.ndarray | float, N: np.ndarray | float | None = None) -> np.ndarray:
        D, r = np.asarray(D, dtype=float), np.asarray(r, dtype=float)
        n_term: Any = 0.0 if self.A == 0 or N is None else self.A / np.asarray(N, dtype=float) ** self.alpha
        return self.E + n_term + self.B * r ** self.eta / D ** self.beta + self.C / (r + self.eps) ** self.gamma

    def constants(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in PARAMS}


@dataclass
class Fit:
    """A fitted law and how it was found."""

    law: Law
    objective: float  # the Huber loss summed over the points
    starts: int  # initialisations tried
    converged: int  # of which L-BFGS reported convergence
    points: int
    rmse: float  # of the losses, in nats
    free: tuple[str, ...] = field(default=())  # the constants fitted (the others fixed)


def _huber(x: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    a = np.abs(x)
    val = np.where(a <= delta, 0.5 * x * x, delta * (a - 0.5 * delta))
    return val, np.clip(x, -delta, delta)


class _Problem:
    """The objective over θ: E, A, B, C as they are (E as log E), the exponents as their logs."""

    def __init__(self, D: np.ndarray, r: np.ndarray, N: np.ndarray | None, y: np.ndarray, sizes: bool, delta: float):
        self.D, self.r, self.y, self.delta = D, r, y, delta
        self.N = N if sizes else None
        self.logy = np.log(y)
        self.names = ("E", "A", "alpha", "B", "beta", "eta", "C", "gamma", "eps") if sizes else \
            ("E", "B", "beta", "eta", "C", "gamma", "eps")
        self.logD = np.log(D)
        with np.errstate(divide="ignore"):
            self.logr = np.where(r > 0, np.log(np.where(r > 0, r, 1.0)), 0.0)
        self.logN = np.log(N) if self.N is not None else None

    def unpack(self, th: np.ndarray) -> dict[str, float]:
        p = dict(zip(self.names, th, strict=True))
        out = {"E": math.exp(p["E"]), "A": 0.0, "alpha": 0.0, "B": p["B"], "C": p["C"]}
        for k in ("beta", "eta", "gamma", "eps") + (("alpha",) if self.N is not None else ()):
            out[k] = math.exp(p[k])
        if self.N is not None:
            out["A"] = p["A"]
        return out

    def terms(self, p: dict[str, float]) -> tuple[np.ndarray, ...]:
        rd = np.where(self.r > 0, np.exp(p["eta"] * self.logr), 0.0)  # r^η, 0 at r = 0
        dd = np.exp(-p["beta"] * self.logD)
        re = (self.r + p["eps"]) ** (-p["gamma"])
        nn = np.exp(-p["alpha"] * self.logN) if self.N is not None else np.zeros_like(self.D)
        return rd, dd, re, nn

    def value_grad(self, th: np.ndarray) -> tuple[float, np.ndarray]:
        p = self.unpack(th)
        rd, dd, re, nn = self.terms(p)
        td, tr, tn = p["B"] * rd * dd, p["C"] * re, p["A"] * nn
        pred = p["E"] + tn + td + tr
        if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
            bad = np.where(np.isfinite(pred), np.minimum(pred, 0.0), -1e3)
            return 1e6 + float(np.sum(bad * bad)), np.zeros_like(th)  # outside the losses' domain: uphill
        res = np.log(pred) - self.logy
        val, dh = _huber(res, self.delta)
        w = dh / pred  # d objective / d pred, per point
        g = {"E": p["E"], "B": rd * dd, "beta": -td * self.logD * p["beta"], "eta": td * self.logr * p["eta"],
             "C": re, "gamma": -tr * np.log(self.r + p["eps"]) * p["gamma"],
             "eps": -p["C"] * p["gamma"] * (self.r + p["eps"]) ** (-p["gamma"] - 1) * p["eps"]}
        if self.N is not None:
            g["A"] = nn
            g["alpha"] = -tn * self.logN * p["alpha"]
        grad = np.array([float(np.sum(w * g[k])) for k in self.names])
        return float(np.sum(val)), grad

    def linear_start(self, expo: dict[str, float]) -> np.ndarray | None:
        """θ with the exponents given and E, (A,) B, C by least squares on the losses."""
        p = {"E": 1.0, "A": 0.0, "B": 0.0, "C": 0.0, **expo}
        p.setdefault("alpha", 0.0)
        rd, dd, re, nn = self.terms(p)
        cols = [np.ones_like(self.D), rd * dd, re] + ([nn] if self.N is not None else [])
        X = np.stack(cols, axis=1)
        coef, *_ = np.linalg.lstsq(X, self.y, rcond=None)
        E = float(coef[0])
        if not math.isfinite(E) or E <= 1e-6:
            E = float(np.min(self.y)) * 0.5
        vals = {"E": math.log(E), "B": float(coef[1]), "C": float(coef[2]), "A": float(coef[3]) if self.N is not None else 0.0}
        vals |= {k: math.log(v) for k, v in expo.items()}
        return np.array([vals[k] for k in self.names])

    @property
    def e_top(self) -> float:
        """The top of log E's range: E_TOP times the largest loss (E is the floor the losses fall to,
        so a fit that wants it above every loss has lost its law; exp of an unbounded log E overflowed)."""
        return math.log(E_TOP * float(np.max(self.y)))

    def bounds(self) -> list[tuple[float | None, float | None]]:
        return [(math.log(BOUNDS[k][0]), math.log(BOUNDS[k][1])) if k in BOUNDS else
                (None, self.e_top) if k == "E" else (None, None) for k in self.names]


def _minimise(prob: _Problem, th0: np.ndarray):
    from scipy.optimize import minimize  # deferred: scipy, ~0.2 s

    return minimize(prob.value_grad, th0, jac=True, method="L-BFGS-B", bounds=prob.bounds(),
                    options={"maxiter": 3000, "ftol": 1e-14, "gtol": 1e-12})


def _law(prob: _Problem, th: np.ndarray) -> Law:
    return Law(**prob.unpack(th))


def fit_law(D: Sequence[float], r: Sequence[float], y: Sequence[float], N: Sequence[float] | None = None,
            delta: float = HUBER_DELTA, start: Law | None = None, strict: bool = True) -> Fit:
    """Fit the D-CPT law to losses ``y`` at tokens ``D`` (> 0), domain shares ``r`` (in [0, 1]) and, when
    they differ, model sizes ``N``. L-BFGS-B from every point of the exponent grid (or from ``start``
    alone: a bootstrap refit). ``strict``: raise :class:`LawError` naming the constant when no start
    converged, E ran to 0, or an exponent of a term that moves the losses ran to the top of its range."""
    Dv, rv, yv = (np.asarray(v, dtype=float) for v in (D, r, y))
    if not (len(Dv) == len(rv) == len(yv)) or len(Dv) == 0:
        raise LawError("D, r and the losses must be non-empty and of one length")
    if np.any(Dv <= 0) or np.any((rv < 0) | (rv > 1)) or np.any(yv <= 0) or not np.all(np.isfinite(yv)):
        raise LawError("tokens must be > 0, ratios in [0, 1] and losses finite and > 0")
    Nv = np.asarray(N, dtype=float) if N is not None else None
    sizes = Nv is not None and len(np.unique(Nv)) > 1
    prob = _Problem(Dv, rv, Nv, yv, sizes, delta)
    if start is not None:
        starts = [np.array([math.log(start.E) if k == "E" else
                            (math.log(max(getattr(start, k), 1e-12)) if k in BOUNDS else getattr(start, k))
                            for k in prob.names])]
    else:
        keys = ("beta", "eta", "gamma", "eps") + (("alpha",) if sizes else ())
        combos = [dict(zip(keys, v, strict=True)) for v in np.array(np.meshgrid(*(GRID[k] for k in keys)))
                  .reshape(len(keys), -1).T]
        starts = [s for s in (prob.linear_start(c) for c in combos) if s is not None]
    best, n_conv = None, 0
    for th0 in starts:
        res = _minimise(prob, th0)
        n_conv += bool(res.success)
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    if best is None or best.fun >= 1e6:
        raise LawError("no initialisation reached a law with positive losses at every point (constant E)")
    law = _law(prob, best.x)
    if best.x[0] >= prob.e_top - 0.01:  # E above every loss, offset by negative terms: no law (bootstrap too)
        raise LawError(f"the fit did not converge: constant E ran to the top of its range ({E_TOP:g} × the largest "
                       f"loss, {law.E:.3g})")
    if strict:
        if n_conv == 0:
            k = prob.names[int(np.argmax(np.abs(best.jac)))]
            raise LawError(f"L-BFGS did not converge from any of {len(starts)} initialisations "
                           f"(steepest remaining gradient: constant {GREEK.get(k, k)})")
        p = law.constants()
        if p["E"] < 1e-3 * float(yv.min()):  # the floor traded away for a flat C term: no law
            raise LawError(f"the fit did not converge: constant E ran to 0 (at {p['E']:.3g})")
        spans = {"B": np.ptp(p["B"] * rv ** p["eta"] / Dv ** p["beta"]),
                 "C": np.ptp(p["C"] / (rv + p["eps"]) ** p["gamma"]),
                 "A": np.ptp(p["A"] / Nv ** p["alpha"]) if sizes else 0.0}
        owner = {"beta": "B", "eta": "B", "gamma": "C", "eps": "C", "alpha": "A"}
        for k, x in zip(prob.names, best.x, strict=True):
            # an exponent running off to the top of its range, in a term that moves the losses: a runaway fit
            if k in BOUNDS and x >= math.log(BOUNDS[k][1]) - 0.01 and spans[owner[k]] > 1e-3:
                raise LawError(f"the fit did not converge: constant {GREEK.get(k, k)} ran to the top of its range "
                               f"{BOUNDS[k]}")
    pred = law(Dv, rv, Nv if sizes else None)
    rmse = float(np.sqrt(np.mean((pred - yv) ** 2)))
    return Fit(law=law, objective=float(best.fun), starts=len(starts), converged=n_conv, points=len(yv),
               rmse=rmse, free=prob.names)


def bootstrap(groups: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]], fit: Fit,
              samples: int, seed: int, delta: float = HUBER_DELTA) -> list[Law]:
    """Refit on ``samples`` resamples of the runs (each group: one run's D, r, y, N), drawn with
    replacement from ``numpy.random.default_rng(seed)``, each from the full fit's constants. A resample
    whose fit fails is dropped (the caller reports how many remain)."""
    rng = np.random.default_rng(seed)
    laws = []
    for _ in range(samples):
        pick = rng.integers(0, len(groups), size=len(groups))
        D = np.concatenate([groups[i][0] for i in pick])
        r = np.concatenate([groups[i][1] for i in pick])
        y = np.concatenate([groups[i][2] for i in pick])
        N = None if groups[0][3] is None else np.concatenate([groups[i][3] for i in pick])  # type: ignore[misc]
        if len(np.unique(r)) < 2:
            continue
        try:
            laws.append(fit_law(D, r, y, N, delta=delta, start=fit.law, strict=False).law)
        except LawError:
            continue
    return laws


def interval(values: np.ndarray, level: float = 0.9) -> tuple[float, float]:
    """The central percentile interval of bootstrap values."""
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


RATIOS = np.linspace(0.0, 1.0, 1001)


def cmr(general: Callable[[np.ndarray], np.ndarray], base: float, tolerance: float,
        ratios: np.ndarray = RATIOS) -> float | None:
    """The critical mixture ratio: the largest domain share whose general loss (``general(ratios)``
    at the tokens in question) is at most ``base + tolerance``; None when no share is."""
    ok = general(ratios) - base <= tolerance
    return float(ratios[ok].max()) if ok.any() else None


def cmr_curve(general: Law, base: float, tolerance: float, tokens: Sequence[float],
              N: float | None = None) -> list[tuple[float, float | None]]:
    """CMR at each token count: [(T, CMR(T) or None)]."""
    return [(float(T), cmr(lambda rr, T=T: general(T, rr, N), base, tolerance)) for T in tokens]


def recommend(domain: Callable[[np.ndarray], np.ndarray], forgetting: Callable[[np.ndarray], np.ndarray],
              max_forgetting: float | None, target_domain_loss: float | None,
              ratios: np.ndarray = RATIOS) -> tuple[float | None, str]:
    """The recommended domain share and why. With ``max_forgetting``: the share of lowest predicted
    domain loss among those forgetting at most that much. With ``target_domain_loss``: the share of
    least forgetting among those reaching it. None (and the reason) when no share meets the constraint."""
    d, f = domain(ratios), forgetting(ratios)
    if target_domain_loss is not None:
        ok = d <= target_domain_loss
        if not ok.any():
            return None, f"no domain share reaches the domain loss {target_domain_loss:g} (best {d.min():.4f} at r={ratios[np.argmin(d)]:.3f})"
        i = np.flatnonzero(ok)[np.argmin(f[ok])]
        return float(ratios[i]), f"least forgetting among the shares reaching domain loss {target_domain_loss:g}"
    assert max_forgetting is not None
    ok = f <= max_forgetting
    if not ok.any():
        return None, f"every domain share forgets more than {max_forgetting:g} nats (least {f.min():.4f} at r={ratios[np.argmin(f)]:.3f})"
    i = np.flatnonzero(ok)[np.argmin(d[ok])]
    return float(ratios[i]), f"lowest domain loss among the shares forgetting at most {max_forgetting:g} nats"
