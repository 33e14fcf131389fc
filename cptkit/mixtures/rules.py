"""Domain-mixture algorithms as pure functions (SPEC §9b–d).

Every function takes and returns plain dicts keyed by domain name; returned weights sum to 1.
Validation is strict: a domain missing from one of the arguments, a negative or NaN weight, or
a NaN/infinite loss raises ``ValueError`` naming the domain. Defined degenerate cases:

* :func:`topic_ppl_update`: when every PPL change is zero the proportions come back unchanged
  (normalised).
* :func:`velocitune_update`: Algorithm 1 literally, Clamp{0, (ℓ_t − ℓ_target)/(ℓ_init − ℓ_target), 1},
  also when ℓ_init < ℓ_target; only ℓ_init = ℓ_target is defined here: V = 1 while ℓ_t > ℓ_target,
  else 0 (the limit of the ratio as ℓ_init falls to ℓ_target from above). ``learnt_guard=True``
  is the older rule: ℓ_init ≤ ℓ_target counts as learnt (V = 0).
* :func:`fit_scaling_law`: E is constrained to E ≥ 0 (a loss cannot fall below 0); a fit that
  yields no finite law raises :class:`ScalingLawError`.
* :func:`dbl_update`: with ``clip`` (default) a domain below its target has distance 0.

References: Llama-3-SynE §4.1.1 (topic PPL), Velocitune §2 / Alg. 1 / App. B, Sheared-LLaMA's
Dynamic Batch Loading (DBL), Chinchilla-form data scaling law L(D) = E + B / D^beta, domain
upsampling §3.1 (base mix from epochs per source, :func:`epoch_weights`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "topic_ppl_update",
    "velocitune_update",
    "dbl_update",
    "fit_scaling_law",
    "ScalingLaw",
    "ScalingLawError",
    "epoch_weights",
    "predict_targets",
    "normalize",
    "static_from_average",
    "plan_average",
]


def _finite(name: str, what: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"domain {name!r}: {what} is not a number: {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"domain {name!r}: {what} is {v}")
    return v


def _weights(w: Mapping[str, float], what: str = "weight") -> dict[str, float]:
    if not w:
        raise ValueError(f"no domains given ({what}s are empty)")
    out = {}
    for name, value in w.items():
        v = _finite(name, what, value)
        if v < 0:
            raise ValueError(f"domain {name!r}: negative {what} {v}")
        out[str(name)] = v
    if sum(out.values()) <= 0:
        raise ValueError(f"{what}s sum to 0: {sorted(out)}")
    return out


def _aligned(domains: Sequence[str], values: Mapping[str, float], what: str) -> dict[str, float]:
    missing = [d for d in domains if d not in values]
    if missing:
        raise ValueError(f"domain {missing[0]!r}: missing from {what}")
    extra = [d for d in values if d not in set(domains)]
    if extra:
        raise ValueError(f"domain {extra[0]!r}: in {what} but not among the weights")
    return {d: _finite(d, what, values[d]) for d in domains}


def normalize(weights: Mapping[str, float]) -> dict[str, float]:
    """Validate non-negative weights and scale them to sum to 1 (order kept)."""
    w = _weights(weights)
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def static_from_average(average: Mapping[str, float], domains: Sequence[str]) -> dict[str, float]:
    """A static mixture at another run's time-averaged weights (its ``avg_weights.json``), over
    ``domains`` (this run's stream): the same domains, none missing and none extra; normalised."""
    return normalize(_aligned(domains, average, "the averaged weights"))


def plan_average(stages: Sequence[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """The time-average of a staged plan, ``Σ_s n_s·w_s / Σ_s n_s`` over ``(n_s sequences, weights w_s)``:
    one static mixture that draws every domain's planned tokens spread evenly over the run (domain
    upsampling's control: the tail's domain tokens without their timing)."""
    if not stages or sum(n for n, _ in stages) <= 0:
        raise ValueError("plan_average: no stage has sequences")
    doms = list(dict.fromkeys(d for _, w in stages for d in w))
    total = float(sum(n for n, _ in stages))
    out = dict.fromkeys(doms, 0.0)
    for n, w in stages:
        if n < 0:
            raise ValueError(f"plan_average: a stage has {n} sequences")
        for d, v in normalize(w).items():
            out[d] += n * v / total
    return normalize(out)


def topic_ppl_update(proportions: Mapping[str, float], prev_ppl: Mapping[str, float],
                     curr_ppl: Mapping[str, float], alpha: float = 0.4) -> dict[str, float]:
    """Llama-3-SynE topic re-weighting after one round of R tokens.

    Δp_i = p_i(t) − p_i(t−1); δ_i = Δp_i / max_j |Δp_j|; f_i = 1 + α·δ_i;
    r_i(t) = r_i(t−1)·f_i / Σ_j r_j(t−1)·f_j. A topic whose PPL rose (got worse) gains share.
    All changes zero → the proportions, normalised, unchanged. ``alpha`` must lie in [0, 1] so
    every factor stays non-negative.
    """
    if not 0.0 <= float(alpha) <= 1.0 or math.isnan(alpha):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    r = _weights(proportions, "proportion")
    prev = _aligned(list(r), prev_ppl, "prev_ppl")
    curr = _aligned(list(r), curr_ppl, "curr_ppl")
    delta = {d: curr[d] - prev[d] for d in r}
    scale = max(abs(v) for v in delta.values())
    if scale == 0.0:
        return normalize(r)
    f = {d: 1.0 + alpha * delta[d] / scale for d in r}
    return normalize({d: r[d] * f[d] for d in r})


def velocity(init: float, target: float, current: float, learnt_guard: bool = False) -> float:
    """Velocitune Algorithm 1: Clamp{0, (ℓ_t − ℓ_target)/(ℓ_init − ℓ_target), 1}.

    Literal also when ℓ_init < ℓ_target. ℓ_init = ℓ_target: 1 while ℓ_t > ℓ_target, else 0.
    ``learnt_guard``: ℓ_init ≤ ℓ_target counts as learnt, V = 0 (cptkit's earlier rule).
    """
    span = init - target
    if learnt_guard and span <= 0:
        return 0.0
    if span == 0:
        return 1.0 if current > target else 0.0
    return min(max((current - target) / span, 0.0), 1.0)


def velocities(init_loss: Mapping[str, float], target_loss: Mapping[str, float] | None,
               current_loss: Mapping[str, float], use_target: bool = True,
               learnt_guard: bool = False) -> dict[str, float]:
    """Velocitune's learning velocity per domain (see :func:`velocity`)."""
    domains = list(current_loss)
    init = _aligned(domains, init_loss, "init_loss")
    cur = {d: _finite(d, "current_loss", v) for d, v in current_loss.items()}
    if not use_target:
        out = {}
        for d in domains:
            if init[d] <= 0:
                raise ValueError(f"domain {d!r}: init_loss must be > 0 for V = l_t / l_init, got {init[d]}")
            out[d] = cur[d] / init[d]
        return out
    if target_loss is None:
        raise ValueError("target_loss is required when use_target=True")
    tgt = _aligned(domains, target_loss, "target_loss")
    return {d: velocity(init[d], tgt[d], cur[d], learnt_guard) for d in domains}


def velocitune_update(weights: Mapping[str, float], init_loss: Mapping[str, float],
                      target_loss: Mapping[str, float] | None, current_loss: Mapping[str, float],
                      use_target: bool = True, learnt_guard: bool = False) -> dict[str, float]:
    """One Velocitune step: V_i = Clamp{0, (ℓ_t − ℓ_target)/(ℓ_init − ℓ_target), 1}; w ← w·exp(V), normalised.

    Slow domains (far from their target, V near 1) gain weight. See :func:`velocity` for
    ℓ_init ≤ ℓ_target and ``learnt_guard``. ``use_target=False`` is the paper's ablation
    V_i = ℓ_t,i / ℓ_init,i (not clamped).
    """
    w = _weights(weights)
    cur = _aligned(list(w), current_loss, "current_loss")
    v = velocities(init_loss, target_loss, cur, use_target=use_target, learnt_guard=learnt_guard)
    return normalize({d: w[d] * math.exp(v[d]) for d in w})


def dbl_update(weights: Mapping[str, float], target_loss: Mapping[str, float],
               current_loss: Mapping[str, float], eta: float = 1.0, smoothing: float = 1e-4,
               clip: bool = True) -> dict[str, float]:
    """Sheared-LLaMA Dynamic Batch Loading: w ← softmax(log w + η·Δ), then (1 − c)·w + c/n.

    Δ_i = ℓ_t,i − ℓ_target,i, clipped at 0 when ``clip`` (the paper; the public code does not
    clip). ``smoothing`` c in [0, 1].
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    w = _weights(weights)
    tgt = _aligned(list(w), target_loss, "target_loss")
    cur = _aligned(list(w), current_loss, "current_loss")
    delta = {d: (max(cur[d] - tgt[d], 0.0) if clip else cur[d] - tgt[d]) for d in w}
    # softmax(log w + eta*delta) computed stably; zero weights stay zero before smoothing
    live = [d for d in w if w[d] > 0]
    top = max(math.log(w[d]) + eta * delta[d] for d in live)
    raw = {d: (math.exp(math.log(w[d]) + eta * delta[d] - top) if w[d] > 0 else 0.0) for d in w}
    soft = normalize(raw)
    n = len(w)
    return {d: (1.0 - smoothing) * soft[d] + smoothing / n for d in w}


class ScalingLawError(ValueError):
    """A scaling-law fit that cannot give a finite law (bad points or a degenerate fit)."""


@dataclass(frozen=True)
class ScalingLaw:
    """L(D) = E + B / D^beta fitted to (tokens, loss) points."""

    E: float
    B: float
    beta: float
    rmse: float = 0.0

    def predict(self, tokens: float | Sequence[float]) -> float | list[float]:
        if isinstance(tokens, (int, float)):
            return self.E + self.B / float(tokens) ** self.beta
        return [self.E + self.B / float(t) ** self.beta for t in tokens]


def _linfit(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least squares y = E + B·x; returns (E, B, sse)."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return my, 0.0, sum((b - my) ** 2 for b in y)
    b = sum((a - mx) * (c - my) for a, c in zip(x, y, strict=True)) / sxx
    e = my - b * mx
    return e, b, sum((c - e - b * a) ** 2 for a, c in zip(x, y, strict=True))


def _fit_fixed_beta(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = E + B·x with E ≥ 0 and B ≥ 0; returns (E, B, sse)."""
    e, b, err = _linfit(xs, ys)
    if b >= 0 and e >= 0:
        return e, b, err
    cands = []
    mean = sum(ys) / len(ys)
    cands.append((max(mean, 0.0), 0.0))  # B = 0: the constant (mean, or 0 if the mean is negative)
    sxx = sum(x * x for x in xs)
    if sxx > 0:  # E = 0: B = Σxy / Σx²
        cands.append((0.0, max(sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx, 0.0)))
    best = min(cands, key=lambda c: sum((y - c[0] - c[1] * x) ** 2 for x, y in zip(xs, ys, strict=True)))
    return best[0], best[1], sum((y - best[0] - best[1] * x) ** 2 for x, y in zip(xs, ys, strict=True))


def fit_scaling_law(tokens: Sequence[float], losses: Sequence[float],
                    beta_range: tuple[float, float] = (1e-3, 3.0)) -> ScalingLaw:
    """Fit L(D) = E + B / D^beta by least squares (variable projection), E ≥ 0, B ≥ 0.

    For a fixed beta the model is linear in (E, B), solved exactly under the constraints
    (an unconstrained optimum with E < 0 is replaced by the better of E = 0 and B = 0); beta
    is found by a log-spaced grid followed by golden-section refinement. If the losses never
    fall, the fit is the constant mean (B = 0). Needs at least 3 points with distinct positive
    token counts and finite, non-negative losses; otherwise, or when the fit is not finite,
    raises :class:`ScalingLawError`.
    """
    pts = [(float(t), float(v)) for t, v in zip(tokens, losses, strict=True)]
    if len(pts) < 3:
        raise ScalingLawError(f"fit_scaling_law needs at least 3 points, got {len(pts)}")
    for t, v in pts:
        if not (math.isfinite(t) and t > 0):
            raise ScalingLawError(f"token counts must be positive and finite, got {t}")
        if not math.isfinite(v) or v < 0:
            raise ScalingLawError(f"loss at {t:g} tokens is {v}")
    if len({t for t, _ in pts}) < 3:
        raise ScalingLawError("fit_scaling_law needs at least 3 distinct token counts")
    # scale tokens for conditioning: L = E + B' (D/s)^-beta with B = B' s^beta
    s = min(t for t, _ in pts)
    xs = [t / s for t, _ in pts]
    ys = [v for _, v in pts]

    def sse(beta: float) -> tuple[float, float, float]:
        return _fit_fixed_beta([x ** -beta for x in xs], ys)

    lo, hi = math.log(beta_range[0]), math.log(beta_range[1])
    grid = [math.exp(lo + (hi - lo) * i / 200) for i in range(201)]
    errs = [sse(b)[2] for b in grid]
    k = min(range(len(grid)), key=lambda i: errs[i])
    a, c = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = c - g * (c - a), a + g * (c - a)
    f1, f2 = sse(x1)[2], sse(x2)[2]
    for _ in range(80):
        if f1 < f2:
            c, x2, f2 = x2, x1, f1
            x1 = c - g * (c - a)
            f1 = sse(x1)[2]
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (c - a)
            f2 = sse(x2)[2]
    beta = (a + c) / 2
    e, b_scaled, err = sse(beta)
    if errs[k] < err:
        beta = grid[k]
        e, b_scaled, err = sse(beta)
    law = ScalingLaw(E=e, B=b_scaled * s ** beta, beta=beta, rmse=math.sqrt(err / len(ys)))
    if not all(math.isfinite(x) for x in (law.E, law.B, law.beta, law.rmse)):
        raise ScalingLawError(f"the fit did not converge to a finite law: {law}")
    return law


def predict_targets(checkpoints: Sequence[tuple[float, Mapping[str, float]]],
                    budget_tokens: float) -> tuple[dict[str, float], dict[str, ScalingLaw], float]:
    """Velocitune target losses from a proxy run's checkpoints (§2.1, App. B).

    ``checkpoints`` are (tokens seen, {domain: eval loss}) in training order. Fits one law per
    domain on all points and extrapolates to ``budget_tokens`` (the real run's tokens). Returns
    (targets, laws, change), where ``change`` is the largest absolute difference, over domains,
    between the predictions of the previous checkpoint set (all but the last checkpoint) and of
    the current set (inf with fewer than 4 checkpoints): App. B stops collecting once it is
    below σ. A failed fit raises :class:`ScalingLawError` naming the domain.
    """
    if len(checkpoints) < 3:
        raise ScalingLawError(f"need at least 3 proxy checkpoints, got {len(checkpoints)}")
    domains = list(checkpoints[0][1])
    toks = [float(t) for t, _ in checkpoints]
    laws, targets = {}, {}
    change = 0.0 if len(checkpoints) >= 4 else math.inf
    for d in domains:
        ys = [_aligned(domains, c[1], f"checkpoint {i}")[d] for i, c in enumerate(checkpoints)]
        try:
            law = fit_scaling_law(toks, ys)
            prev = fit_scaling_law(toks[:-1], ys[:-1]) if len(checkpoints) >= 4 else None
        except ScalingLawError as e:
            raise ScalingLawError(f"domain {d!r}: scaling-law fit failed: {e}") from None
        laws[d] = law
        targets[d] = float(law.predict(budget_tokens))
        if prev is not None:
            change = max(change, abs(float(prev.predict(budget_tokens)) - targets[d]))
    return targets, laws, change


def epoch_weights(epochs: Mapping[str, float], sizes: Mapping[str, float], budget_tokens: float,
                  fill: str) -> dict[str, float]:
    """Base-mix weights from target epochs per source (domain upsampling §3.1, Table 2).

    Source i contributes e_i · size_i tokens of the ``budget_tokens``; the ``fill`` source (large
    web data) takes the rest. Weights are token shares of the budget (sum to 1). Raises
    ``ValueError`` when the chosen epochs already exceed the budget or a size is unknown.
    """
    if budget_tokens <= 0:
        raise ValueError(f"budget_tokens must be > 0, got {budget_tokens}")
    if fill in epochs:
        raise ValueError(f"domain {fill!r}: the fill domain takes the rest, it cannot also have epochs")
    if fill not in sizes:
        raise ValueError(f"domain {fill!r}: fill domain has no size")
    out: dict[str, float] = {}
    for d, e in epochs.items():
        e = _finite(d, "epochs", e)
        if e < 0:
            raise ValueError(f"domain {d!r}: negative epochs {e}")
        if d not in sizes:
            raise ValueError(f"domain {d!r}: no size (tokens) known")
        out[d] = e * _finite(d, "size", sizes[d]) / budget_tokens
    used = sum(out.values())
    if used > 1.0 + 1e-12:
        raise ValueError(f"the chosen epochs need {used * budget_tokens:.6g} tokens, more than the budget "
                         f"{budget_tokens:.6g}: nothing is left for the fill domain {fill!r}")
    out[fill] = max(1.0 - used, 0.0)
    return out


class TargetEstimator:
    """Velocitune App. B: collect proxy checkpoints until the predicted targets settle.

    :meth:`add` takes one checkpoint (tokens seen, {domain: eval loss}); from the 4th on it fits
    the current checkpoint set and the previous one (all but the newest) and returns True once
    the largest change of a domain's predicted target at ``budget_tokens`` is below ``sigma``.
    ``history`` keeps (checkpoints, change) per check.
    """

    def __init__(self, budget_tokens: float, sigma: float, min_checkpoints: int = 4):
        if sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        if min_checkpoints < 4:
            raise ValueError("min_checkpoints must be ≥ 4: the previous set needs 3 points for a fit")
        self.budget, self.sigma, self.min_checkpoints = float(budget_tokens), float(sigma), int(min_checkpoints)
        self.checkpoints: list[tuple[float, dict[str, float]]] = []
        self.history: list[tuple[int, float]] = []
        self.targets: dict[str, float] = {}
        self.laws: dict[str, ScalingLaw] = {}
        self.change = math.inf

    @property
    def converged(self) -> bool:
        return self.change < self.sigma

    def add(self, tokens: float, losses: Mapping[str, float]) -> bool:
        self.checkpoints.append((float(tokens), dict(losses)))
        if len(self.checkpoints) >= 3:
            self.targets, self.laws, change = predict_targets(self.checkpoints, self.budget)
            if len(self.checkpoints) >= self.min_checkpoints:
                self.change = change
                self.history.append((len(self.checkpoints), change))
        return self.converged
