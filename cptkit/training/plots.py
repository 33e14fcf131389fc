"""The figures of a training run, drawn from its metrics log (:mod:`cptkit.training.metrics`):
``loss.png`` (:func:`plot_loss`), ``curves.png`` (:func:`plot_curves`: the forgetting curves, eval
loss per domain against tokens, next to the mixture weight trajectory) and several runs in one
figure (:func:`overlay_curves`, ``cptkit evaluate-compare --curves``). Every PNG is written
atomically; without matplotlib a plot is skipped with a note."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.records import read_jsonl
from cptkit.eval.stats import mean_se
from cptkit.training.metrics import eval_curves


def _save(fig, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, out)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_curves(run_dir: Path, out: Path) -> str | None:
    """``curves.png`` of a run: eval loss per domain vs tokens (left), mixture weights vs tokens (right).

    Returns a note when there is nothing to plot or matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed: curves.png skipped (pip install matplotlib)"
    rows = read_jsonl(run_dir / "metrics.jsonl", missing_ok=True)
    tokens, losses, scores = eval_curves(rows)
    if not tokens:
        return None
    fig, (ax, aw) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    for d, ys in losses.items():
        ax.plot(tokens, ys, marker="o", markersize=3, label=d)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.set_title("per-domain eval loss")
    if scores:
        at = ax.twinx()
        for t, ys in scores.items():
            at.plot(tokens, [100 * y for y in ys], linestyle="--", color="gray", label=f"{t} (right axis, %)")
        at.set_ylabel("task score (%)")
        at.legend(fontsize=7, loc="upper right")
    ax.legend(fontsize=7, loc="upper left")
    steps = [r for r in rows if "weights" in r and "loss" in r]
    for d in (steps[0]["weights"] if steps else {}):
        aw.plot([r["tokens"] for r in steps], [r["weights"][d] for r in steps], drawstyle="steps-post", label=d)
    aw.set_xlabel("training tokens")
    aw.set_ylabel("domain weight (share of sequences)")
    aw.set_title("mixture")
    aw.set_ylim(-0.02, 1.02)
    if steps:
        aw.legend(fontsize=7, loc="best")
    _save(fig, out)
    return None


def overlay_curves(runs: dict[str, Path | list[Path]], out: Path) -> str | None:
    """One panel per domain, one line per run: eval loss vs tokens from each run's ``metrics.jsonl``.
    A run given as several directories (one per seed) is drawn as its mean, shaded ± standard error."""
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed: no curves (pip install matplotlib)"
    data: dict[str, tuple[list[float], dict[str, list[tuple[float, float]]], int]] = {}
    for name, dirs in runs.items():
        seeds = []
        for d in dirs if isinstance(dirs, list) else [dirs]:
            tokens, losses, _ = eval_curves(read_jsonl(Path(d) / "metrics.jsonl", missing_ok=True))
            if not tokens:
                raise CptkitError(f"{d}: no eval losses in metrics.jsonl (train with train.eval_every > 0)")
            seeds.append((tokens, losses))
        tokens = seeds[0][0]
        if any(t != tokens for t, _ in seeds):
            raise CptkitError(f"{name}: its seeds were evaluated at different token counts: cannot average them")
        doms = [x for x in seeds[0][1] if all(x in ls for _, ls in seeds)]
        data[name] = (tokens, {x: [mean_se([ls[x][i] for _, ls in seeds]) for i in range(len(tokens))]
                               for x in doms}, len(seeds))
    domains: list[str] = []
    for _, losses, _ in data.values():
        domains += [x for x in losses if x not in domains]
    fig, axes = plt.subplots(1, len(domains), figsize=(4.5 * len(domains), 4), dpi=100, squeeze=False)
    for ax, dom in zip(axes[0], domains, strict=True):
        for name, (tokens, losses, n) in data.items():
            if dom not in losses:
                continue
            mean = [m for m, _ in losses[dom]]
            line = ax.plot(tokens, mean, marker="o", markersize=3, label=name if n == 1 else f"{name} ({n} seeds)")[0]
            if n > 1:
                se = [0.0 if math.isnan(e) else e for _, e in losses[dom]]
                ax.fill_between(tokens, [m - e for m, e in zip(mean, se, strict=True)],
                                [m + e for m, e in zip(mean, se, strict=True)], color=line.get_color(), alpha=0.2)
        ax.set_title(f"{dom}: held-out loss")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("nats/token" + (" (mean ± SE)" if any(n > 1 for *_, n in data.values()) else ""))
        ax.legend(fontsize=7)
    _save(fig, out)
    return None


def plot_loss(metrics: Path, out: Path) -> str | None:
    """``loss.png``: training loss per step and per-domain eval losses, over tokens."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: loss.png skipped (pip install matplotlib)"
    rows = read_jsonl(metrics, missing_ok=True)
    train = [r for r in rows if "loss" in r and r.get("event") != "eval"]
    if not train:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([r["tokens"] for r in train], [r["loss"] for r in train], lw=1, label="train loss")
    evals = [r for r in rows if isinstance(r.get("eval_loss"), dict)]
    for d in sorted({d for r in evals for d in r["eval_loss"]}):
        pts = [(r.get("eval_tokens", r["tokens"]), r["eval_loss"][d]) for r in evals if d in r["eval_loss"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, lw=1, label=f"eval {d}")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    save_figure(fig, out)
    return None


def save_figure(fig: Any, out: Path) -> None:
    """Legend, layout, and an atomic PNG write (a reader never sees half a file)."""
    import matplotlib.pyplot as plt

    fig.axes[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, out)


Point = tuple[float, float, float, float]  # x mean, x SE, y mean, y SE


def pareto_figure(points: dict[str, Point], sweep: list[str], xlabel: str, ylabel: str, title: str = ""):
    """The Pareto figure (not saved): one point per arm with its seed error bars in both directions
    (± 1 SE; none where the SE is NaN), and the ``sweep`` (names in order, e.g. merge alphas from B0 to
    the no-replay model) joined by one line through its points."""
    plt = _pyplot()
    if plt is None:
        return None
    missing = [n for n in sweep if n not in points]
    if missing:
        raise CptkitError(f"the sweep names {missing[0]!r}, which has no point ({', '.join(points)})")
    fig, ax = plt.subplots(figsize=(7, 5), dpi=100)

    def bar(e: float) -> float:
        return 0.0 if math.isnan(e) else e

    for name, (x, xe, y, ye) in points.items():
        ax.errorbar([x], [y], xerr=[bar(xe)], yerr=[bar(ye)], fmt="o" if name not in sweep else "s",
                    markersize=5, capsize=3, label=name)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if sweep:
        ax.plot([points[n][0] for n in sweep], [points[n][2] for n in sweep], "-", color="gray", lw=1,
                label=" → ".join(sweep))
    ax.axhline(0.0, color="black", lw=0.5)
    ax.axvline(0.0, color="black", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="best")
    return fig


def pareto_plot(points: dict[str, Point], sweep: list[str], out: Path, xlabel: str, ylabel: str,
                title: str = "") -> str | None:
    """:func:`pareto_figure` written to ``out`` (PNG, atomically); a note without matplotlib."""
    fig = pareto_figure(points, sweep, xlabel, ylabel, title)
    if fig is None:
        return "matplotlib is not installed: no Pareto plot (pip install matplotlib)"
    _save(fig, out)
    return None
