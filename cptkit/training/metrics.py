"""Forgetting curves: per-domain held-out loss (and few-shot task scores) during training, plotted.

``train`` calls :func:`evaluate_point` every ``train.eval_every`` steps, before the first step and
after the last one; each point lands in ``metrics.jsonl`` as ``eval_loss`` (per domain, nats per
token) and ``eval_tasks`` (``train.eval_tasks``: ``acc_norm`` / ``exact_match`` in [0, 1]) with
``eval_tokens``, the training tokens seen when it was measured. :func:`plot_curves` draws
``curves.png``: eval loss per domain against tokens, one line per domain, next to the mixture
weight trajectory. :func:`overlay_curves` draws several runs in one figure
(``cptkit evaluate-compare --curves``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError


def load_eval_tasks(names: list[str], task_dir: str | None = None, data_dir: str = "~/.cache/cptkit/eval") -> list:
    """The ``cptkit evaluate`` task definitions named in ``train.eval_tasks`` (data loaded now: fails fast)."""
    from cptkit.core.config import CONF_DIR
    from cptkit.eval import task_data, tasks

    d = task_dir or str(Path(CONF_DIR) / "eval" / "tasks")
    out = []
    for n in names:
        t = tasks.load_task(str(n), d, os.path.expanduser(data_dir))
        task_data.load_docs(t, t.spec["test_split"])
        out.append(t)
    return out


def evaluate_point(model, tokenizer, records: list[dict], tcfg: Any, seq_len: int, tasks: list,
                   cache: Any = None) -> dict[str, Any]:
    """``{"eval_loss": {domain: loss}, "eval_tasks": {task: score}}`` of the model now (eval mode, no grad;
    ``cache``: an :class:`~cptkit.training.evaluation.InitEvalCache`, for the untrained model only)."""
    from cptkit.eval import runner
    from cptkit.models.scoring import group_losses

    was_training = model.training
    model.eval()
    try:
        def compute() -> dict[str, dict[str, float]]:
            return group_losses(model, tokenizer, records, group_by="domain",
                                max_docs_per_group=int(tcfg.eval_docs) or None,  # 0: all, as domain_eval
                                max_length=seq_len, max_tokens=int(tcfg.eval_max_tokens))

        res = cache.group_losses(compute, int(tcfg.eval_docs) or None) if cache is not None else compute()
        out: dict[str, Any] = {"eval_loss": {d: float(v["loss"]) for d, v in res.items()}}
        if tasks:
            scores = {}
            for t in tasks:
                m, _ = runner.run_task(model, tokenizer, t, num_fewshot=tcfg.eval_tasks_shots,
                                       limit=int(tcfg.eval_tasks_limit) or None, max_length=seq_len)
                scores[t.name] = float(headline_score(m))
            out["eval_tasks"] = scores
    finally:
        model.train(was_training)
    return out


def headline_score(metrics: dict[str, Any]) -> float:
    """A task's headline score: acc_norm (multiple choice) or exact_match (generative)."""
    for k in ("acc_norm", "exact_match", "acc"):
        if k in metrics:
            return float(metrics[k])
    raise CptkitError(f"task metrics without acc_norm/exact_match: {sorted(metrics)}")


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_curves(rows: list[dict]) -> tuple[list[int], dict[str, list[float]], dict[str, list[float]]]:
    """From ``metrics.jsonl`` rows: eval token positions, loss per domain and score per task, aligned."""
    pts = [r for r in rows if "eval_loss" in r]
    tokens = [int(r.get("eval_tokens", r["tokens"])) for r in pts]
    domains: list[str] = []
    tasks: list[str] = []
    for r in pts:
        domains += [d for d in r["eval_loss"] if d not in domains]
        tasks += [t for t in (r.get("eval_tasks") or {}) if t not in tasks]
    nan = float("nan")
    losses = {d: [float(r["eval_loss"].get(d, nan)) for r in pts] for d in domains}
    scores = {t: [float((r.get("eval_tasks") or {}).get(t, nan)) for r in pts] for t in tasks}
    return tokens, losses, scores


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
    rows = read_jsonl(run_dir / "metrics.jsonl")
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
    from cptkit.eval.stats import mean_se

    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed: no curves (pip install matplotlib)"
    data: dict[str, tuple[list[float], dict[str, list[tuple[float, float]]], int]] = {}
    for name, dirs in runs.items():
        seeds = []
        for d in dirs if isinstance(dirs, list) else [dirs]:
            tokens, losses, _ = eval_curves(read_jsonl(Path(d) / "metrics.jsonl"))
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


def run_dir_of(results: dict[str, Any]) -> Path | None:
    """The training run behind an ``evaluate`` result: its model's parent, when it holds metrics.jsonl."""
    model = ((results.get("config") or {}).get("eval") or {}).get("model")
    if not model:
        return None
    d = Path(str(model)).parent
    return d if (d / "metrics.jsonl").exists() else None
