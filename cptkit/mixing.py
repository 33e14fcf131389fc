"""Domain-mixture algorithms as pure functions (SPEC §9b–d).

Every function takes and returns plain dicts keyed by domain name; returned weights sum to 1.
Validation is strict: a domain missing from one of the arguments, a negative or NaN weight, or
a NaN/infinite loss raises ``ValueError`` naming the domain. Defined degenerate cases:

* :func:`topic_ppl_update`: when every PPL change is zero the proportions come back unchanged
  (normalised).
* :func:`velocitune_update`: a domain whose initial loss is not above its target counts as
  learnt (velocity 0).
* :func:`dbl_update`: with ``clip`` (default) a domain below its target has distance 0.

References: Llama-3-SynE §4.1.1 (topic PPL), Velocitune §2 / Alg. 1, Sheared-LLaMA's Dynamic
Batch Loading (DBL), Chinchilla-form data scaling law L(D) = E + B / D^beta.
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
    "predict_targets",
    "normalize",
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


def velocities(init_loss: Mapping[str, float], target_loss: Mapping[str, float] | None,
               current_loss: Mapping[str, float], use_target: bool = True) -> dict[str, float]:
    """Velocitune's learning velocity per domain (see :func:`velocitune_update`)."""
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
    out = {}
    for d in domains:
        span = init[d] - tgt[d]
        out[d] = 0.0 if span <= 0 else min(max((cur[d] - tgt[d]) / span, 0.0), 1.0)
    return out


def velocitune_update(weights: Mapping[str, float], init_loss: Mapping[str, float],
                      target_loss: Mapping[str, float] | None, current_loss: Mapping[str, float],
                      use_target: bool = True) -> dict[str, float]:
    """One Velocitune step: V_i = clamp((ℓ_t − ℓ_target)/(ℓ_init − ℓ_target), 0, 1); w ← w·exp(V), normalised.

    Slow domains (far from their target, V near 1) gain weight. A domain with
    ℓ_init ≤ ℓ_target counts as learnt (V = 0). ``use_target=False`` is the paper's ablation
    V_i = ℓ_t,i / ℓ_init,i (not clamped).
    """
    w = _weights(weights)
    cur = _aligned(list(w), current_loss, "current_loss")
    v = velocities(init_loss, target_loss, cur, use_target=use_target)
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


def fit_scaling_law(tokens: Sequence[float], losses: Sequence[float],
                    beta_range: tuple[float, float] = (1e-3, 3.0)) -> ScalingLaw:
    """Fit L(D) = E + B / D^beta by least squares (variable projection).

    For a fixed beta the model is linear in (E, B), solved exactly; beta is found by a
    log-spaced grid followed by golden-section refinement. ``B`` is constrained ≥ 0 (loss
    falls with data); if the data never fall, the fit is the constant mean (B = 0).
    Needs at least 3 points with distinct positive token counts.
    """
    pts = [(float(t), float(v)) for t, v in zip(tokens, losses, strict=True)]
    if len(pts) < 3:
        raise ValueError(f"fit_scaling_law needs at least 3 points, got {len(pts)}")
    for t, v in pts:
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"token counts must be positive and finite, got {t}")
        if not math.isfinite(v):
            raise ValueError(f"loss at {t:g} tokens is {v}")
    if len({t for t, _ in pts}) < 3:
        raise ValueError("fit_scaling_law needs at least 3 distinct token counts")
    # scale tokens for conditioning: L = E + B' (D/s)^-beta with B = B' s^beta
    s = min(t for t, _ in pts)
    xs = [t / s for t, _ in pts]
    ys = [v for _, v in pts]

    def sse(beta: float) -> tuple[float, float, float]:
        e, b, err = _linfit([x ** -beta for x in xs], ys)
        if b < 0:
            mean = sum(ys) / len(ys)
            return mean, 0.0, sum((y - mean) ** 2 for y in ys)
        return e, b, err

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
    return ScalingLaw(E=e, B=b_scaled * s ** beta, beta=beta, rmse=math.sqrt(err / len(ys)))


def predict_targets(checkpoints: Sequence[tuple[float, Mapping[str, float]]], budget_tokens: float,
                    sigma: float = 0.0) -> tuple[dict[str, float], dict[str, ScalingLaw], float]:
    """Velocitune target losses from a proxy run's checkpoints.

    ``checkpoints`` are (tokens seen, {domain: eval loss}) in training order. Fits one law per
    domain on all points and extrapolates to ``budget_tokens``. Returns (targets, laws,
    change), where ``change`` is the largest absolute change of a domain's prediction against
    the fit without the last checkpoint (inf with fewer than 4 checkpoints): collecting can
    stop once it falls below ``sigma`` (Velocitune App. B).
    """
    if len(checkpoints) < 3:
        raise ValueError(f"need at least 3 proxy checkpoints, got {len(checkpoints)}")
    domains = list(checkpoints[0][1])
    toks = [float(t) for t, _ in checkpoints]
    laws, targets = {}, {}
    change = 0.0 if len(checkpoints) >= 4 else math.inf
    for d in domains:
        ys = [_aligned(domains, c[1], f"checkpoint {i}")[d] for i, c in enumerate(checkpoints)]
        law = fit_scaling_law(toks, ys)
        laws[d] = law
        targets[d] = float(law.predict(budget_tokens))
        if len(checkpoints) >= 4:
            prev = fit_scaling_law(toks[:-1], ys[:-1])
            change = max(change, abs(float(prev.predict(budget_tokens)) - targets[d]))
    return targets, laws, change
