"""plan: fit the D-CPT Law to finished train runs and recommend a domain share for a token budget (docs/plan.md)

``cptkit plan --in 'runs/*/' --out plan/ plan.target_tokens=2e6 plan.max_forgetting=0.05``

Each run (a finished ``cptkit train`` output) gives its domain share r, read from its stream's
manifest (the tokens its plan draws from domains other than ``plan.general``, over all planned
tokens; never from a name), its model size N (its ``model/*.safetensors``), and at each
``train.eval_every`` point its tokens D and its held-out losses by group (``metrics.jsonl``: the
stream's domains and the ``train.eval_extra`` groups). The law L(N, D, r) = E + A/N^α + B·r^η/D^β +
C/(r+ε)^γ (Que et al. 2024) is fitted to the domain loss (``plan.domain``) and to every other group, a
forgetting measure (its rise over the run's loss before step 1), with a Huber loss on log-losses
and L-BFGS from a grid of starts; the intervals come from refits on runs drawn with replacement
(``plan.bootstrap``, seeded by ``seed``). With one model size the N term is folded into E.

The answer, at ``plan.target_tokens``: under ``plan.max_forgetting`` nats on
``plan.forgetting_measure``, the share of lowest predicted domain loss; with
``plan.target_domain_loss``, the share of least forgetting that reaches it. Also the critical mixture
ratio (Gu et al. 2024) over tokens. Outputs under ``--out``: ``plan.json`` (constants, intervals,
the answer, the CMR curve, the runs read), ``plan.md``, ``plan.png`` (the fitted surfaces over the
observed points).
"""

from __future__ import annotations

import glob
import io
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.output import TaskResult, is_finished
from cptkit.core.progress import console, log
from cptkit.core.records import read_jsonl
from cptkit.core.run import Run
from cptkit.core.step import IN, OUT, QUIET, step
from cptkit.mixtures import law as dcpt
from cptkit.training.metrics import eval_curves

RESULTS, REPORT, FIGURE, PREDICTION = "plan.json", "plan.md", "plan.png", "prediction.yaml"


@dataclass
class PlanConfig:
    target_tokens: float = 0.0  # the planned run's training tokens (required)
    domain: str = "domain"  # the eval group whose loss is the domain loss
    general: list[str] = field(default_factory=lambda: ["general"])  # stream domains that are old (replayed) data
    forgetting_measure: str = "general"  # the eval group the forgetting constraint is on
    max_forgetting: float = 0.05  # nats above the run's loss before step 1, on forgetting_measure
    target_domain_loss: float | None = None  # instead: the least forgetting that reaches this domain loss
    min_ratios: int = 4  # distinct domain shares needed to fit the law
    min_points: int = 4  # eval points after step 0 needed per run
    bootstrap: int = 200  # refits on runs drawn with replacement (the intervals); 0: none
    level: float = 0.9  # the intervals' coverage
    huber_delta: float = dcpt.HUBER_DELTA  # on log-loss residuals (the paper's 1e-3)
    # domain shares to predict every loss at, at target_tokens (prediction.yaml: a pre-registration)
    predict_ratios: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        check(self.target_tokens >= 0 and math.isfinite(self.target_tokens), "target_tokens", self.target_tokens,
              "the planned run's tokens: a number > 0")
        check(self.max_forgetting > 0, "max_forgetting", self.max_forgetting, "must be > 0 nats")
        check(self.target_domain_loss is None or self.target_domain_loss > 0, "target_domain_loss",
              self.target_domain_loss, "must be > 0")
        check(self.min_ratios >= 2, "min_ratios", self.min_ratios, "must be ≥ 2")
        check(self.min_points >= 2, "min_points", self.min_points, "must be ≥ 2")
        check(self.bootstrap >= 0, "bootstrap", self.bootstrap, "must be ≥ 0")
        check(0 < self.level < 1, "level", self.level, "must be in (0, 1)")
        check(self.huber_delta > 0, "huber_delta", self.huber_delta, "must be > 0")
        for r in self.predict_ratios:
            check(0 <= float(r) <= 1, "predict_ratios", r, "each a domain share in [0, 1]")


@dataclass
class PlanJob(JobConfig):
    plan: PlanConfig = field(default_factory=PlanConfig)


@dataclass
class RunData:
    """One finished train run as the law sees it."""

    path: str
    ratio: float  # domain share of its stream's planned tokens
    replay_share: float | None  # the stream's mix.replay.share, as recorded
    params: int | None  # model parameters
    tokens: np.ndarray  # eval points after step 0
    losses: dict[str, np.ndarray]  # group -> loss at those points
    base: dict[str, float]  # group -> loss before step 1


# --- reading the runs -------------------------------------------------------------------------------


def run_dirs(inputs: list[str]) -> list[Path]:
    """``--in`` values (directories or globs), expanded and sorted, each once."""
    out: list[Path] = []
    for spec in inputs:
        hits = sorted(glob.glob(spec)) if any(c in spec for c in "*?[") else [spec]
        if not hits:
            raise CptkitError(f"--in {spec}: matches no run directory")
        out += [Path(h) for h in hits if Path(h) not in out]
    return out


def _json(path: Path, what: str) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CptkitError(f"{path}: missing ({what})") from None
    except json.JSONDecodeError as e:
        raise CptkitError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise CptkitError(f"{path}: line 1: expected a JSON object")
    return obj


def stream_of(run: Path) -> tuple[Path, dict]:
    """The stream a train run read (its manifest's ``data.stream``) and that stream's description
    (the build-mix manifest's ``stream`` entry)."""
    man = _json(run / "_manifest.json", "a finished cptkit train run has one")
    if man.get("step") != "train":
        raise CptkitError(f"{run / '_manifest.json'}: written by step {man.get('step')!r}, not train")
    where = ((man.get("data") or {}).get("stream"))
    if not where:
        raise CptkitError(f"{run / '_manifest.json'}: records no data.stream (not a cptkit train run)")
    sdir = Path(where)
    smeta = (_json(sdir / "_manifest.json", f"the stream {run} trained on").get("stream") or {})
    if not smeta.get("domains"):
        raise CptkitError(f"{sdir / '_manifest.json'}: records no stream domains (not a build-mix output)")
    return sdir, smeta


def domain_share(smeta: dict, general: list[str], where: Path) -> float:
    """The share of the stream's planned tokens drawn from domains not in ``general``."""
    planned = {d["name"]: float(d.get("planned_tokens") or 0) for d in smeta["domains"]}
    total = sum(planned.values())
    if total <= 0:
        raise CptkitError(f"{where}: the stream plans no tokens")
    return sum(v for k, v in planned.items() if k not in general) / total


def model_params(run: Path) -> int | None:
    """Parameters of the run's final model, from its safetensors headers (no weights read)."""
    n = 0
    for f in sorted((run / "model").glob("*.safetensors")):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        n += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return n or None


def read_run(run: Path, cfg: PlanConfig) -> RunData:
    if not is_finished(run):
        raise CptkitError(f"{run}: not a finished train run (no _SUCCESS)")
    sdir, smeta = stream_of(run)
    metrics = run / "metrics.jsonl"
    if not metrics.exists():
        raise CptkitError(f"{metrics}: missing (a finished cptkit train run has one)")
    tokens, losses, _ = eval_curves(read_jsonl(metrics))
    t = np.asarray(tokens, dtype=float)
    for group in [cfg.domain, cfg.forgetting_measure]:
        if group not in losses:
            raise CptkitError(f"{metrics}: no eval loss for {group!r} (groups: {', '.join(losses) or 'none'}; "
                              f"train with train.eval_every > 0 and the group in the stream or train.eval_extra)")
    if not np.any(t == 0):
        raise CptkitError(f"{metrics}: no eval point before step 1 (train.eval_every > 0 gives one): "
                          "forgetting is measured from it")
    after = t > 0
    if int(after.sum()) < cfg.min_points:
        raise CptkitError(f"{metrics}: {int(after.sum())} eval points after step 0; the law needs ≥ {cfg.min_points} "
                          "per run (plan.min_points; a smaller train.eval_every gives more)")
    first = int(np.flatnonzero(t == 0)[-1])
    vals = {g: np.asarray(v, dtype=float) for g, v in losses.items()}
    keep = {g: v for g, v in vals.items() if np.all(np.isfinite(v[after])) and math.isfinite(v[first])}
    replay = (smeta.get("replay") or {}).get("share")
    return RunData(path=str(run), ratio=domain_share(smeta, cfg.general, sdir / "_manifest.json"),
                   replay_share=None if replay is None else float(replay), params=model_params(run),
                   tokens=t[after], losses={g: v[after] for g, v in keep.items()},
                   base={g: float(v[first]) for g, v in keep.items()})


# --- the fit and the answer ---------------------------------------------------------------------------


def groups_of(runs: list[RunData], group: str, sizes: bool):
    return [(r.tokens, np.full(len(r.tokens), r.ratio), r.losses[group],
             np.full(len(r.tokens), float(r.params)) if sizes else None) for r in runs]


def fit_group(runs: list[RunData], group: str, cfg: PlanConfig, seed: int, sizes: bool
              ) -> tuple[dcpt.Fit, list[dcpt.Law]]:
    g = groups_of(runs, group, sizes)
    D, r, y = (np.concatenate([x[i] for x in g]) for i in range(3))
    N = np.concatenate([x[3] for x in g]) if sizes else None  # type: ignore[misc]
    try:
        fit = dcpt.fit_law(D, r, y, N, delta=cfg.huber_delta)
    except dcpt.LawError as e:
        raise CptkitError(f"plan: the law of {group!r}: {e}") from None
    return fit, dcpt.bootstrap(g, fit, cfg.bootstrap, seed, cfg.huber_delta)


def implausible(predicted: dict[str, dict[str, Any]] | None) -> list[str]:
    """One line per predicted loss (or interval end) at or below 0 nats: a law that predicts that does
    not describe the runs it was fitted on, whatever share it recommends."""
    out = []
    for g, p in (predicted or {}).items():
        lo = p["interval"][0]
        if p["loss"] <= 0 or (lo is not None and lo <= 0):
            out.append(f"the law of {g!r} predicts a loss of {p['loss']:.3g} nats (interval from "
                       f"{'—' if lo is None else f'{lo:.3g}'}): a loss is > 0, so it does not describe these runs")
    return out


def plan_answer(runs: list[RunData], cfg: PlanConfig, seed: int) -> tuple[dict[str, Any], dict]:
    """Fit every group and answer the planning question (plain data: plan.json)."""
    sizes = len({r.params for r in runs}) > 1
    if sizes and any(r.params is None for r in runs):
        raise CptkitError(f"{next(r.path for r in runs if r.params is None)}: no model/*.safetensors: "
                          "the model size is needed when the runs' sizes differ")
    N = float(max(r.params or 0 for r in runs)) if sizes else None
    groups = [cfg.domain] + sorted(set.intersection(*(set(r.losses) for r in runs)) - {cfg.domain})
    T = cfg.target_tokens
    lvl = cfg.level
    fits: dict[str, Any] = {}
    laws: dict[str, tuple[dcpt.Law, list[dcpt.Law]]] = {}
    skipped: dict[str, str] = {}
    for k, group in enumerate(groups):
        try:
            fit, boot = fit_group(runs, group, cfg, seed + k, sizes)
        except CptkitError as e:
            if group in (cfg.domain, cfg.forgetting_measure):  # the answer needs it: refuse
                raise
            log.warning("%s (left out: the answer does not use it)", e)
            skipped[group] = str(e)
            continue
        laws[group] = (fit.law, boot)
        base = float(np.mean([r.base[group] for r in runs]))
        fits[group] = {"role": "domain" if group == cfg.domain else "forgetting", "constants": fit.law.constants(),
                       "base_loss": base, "rmse": fit.rmse, "points": fit.points, "starts": fit.starts,
                       "converged_starts": fit.converged, "bootstrap_fits": len(boot),
                       "constants_interval": {p: dcpt.interval(np.array([getattr(b, p) for b in boot]), lvl)
                                              for p in dcpt.PARAMS} if boot else None}

    def pred(group: str, D: float, rr: np.ndarray) -> np.ndarray:
        return laws[group][0](D, rr, N)

    fm = cfg.forgetting_measure
    base_f = fits[fm]["base_loss"]
    ratio, why = dcpt.recommend(lambda rr: pred(cfg.domain, T, rr), lambda rr: pred(fm, T, rr) - base_f,
                                None if cfg.target_domain_loss is not None else cfg.max_forgetting,
                                cfg.target_domain_loss)

    def at(group: str, rr: float) -> dict[str, Any]:
        point = float(laws[group][0](T, rr, N))
        boot = np.array([b(T, rr, N) for b in laws[group][1]], dtype=float)
        lo, hi = dcpt.interval(boot[np.isfinite(boot)], lvl) if len(boot) else (None, None)
        out = {"loss": point, "interval": [lo, hi]}
        if fits[group]["role"] == "forgetting":
            b = fits[group]["base_loss"]
            out |= {"forgetting": point - b, "forgetting_interval": [None if lo is None else lo - b,
                                                                     None if hi is None else hi - b]}
        return out

    groups = [g for g in groups if g in laws]
    predictions = [{"ratio": float(rr), "tokens": T, **{g: at(g, float(rr)) for g in groups}}
                   for rr in cfg.predict_ratios]
    observed = max(float(r.tokens.max()) for r in runs)
    lo_t = min(float(r.tokens.min()) for r in runs)
    curve_t = np.geomspace(lo_t, max(T, observed), 12)
    curve = [{"tokens": t, "cmr": c} for t, c in dcpt.cmr_curve(laws[fm][0], base_f, cfg.max_forgetting, curve_t, N)]
    predicted = {g: at(g, ratio) for g in groups} if ratio is not None else None
    warnings = implausible(predicted)
    for w in warnings:
        log.warning("plan: %s", w)
    return {
        "target_tokens": T, "model_params": N, "sizes_fitted": sizes, "warnings": warnings,
        "constraint": ({"target_domain_loss": cfg.target_domain_loss, "forgetting_measure": fm}
                       if cfg.target_domain_loss is not None else
                       {"max_forgetting": cfg.max_forgetting, "forgetting_measure": fm}),
        "recommended_ratio": ratio, "why": why,
        "predicted": predicted,
        "cmr": {"measure": fm, "tolerance": cfg.max_forgetting,
                "at_target": dcpt.cmr(lambda rr: pred(fm, T, rr), base_f, cfg.max_forgetting), "curve": curve},
        "predictions": predictions, "extrapolation": T / observed, "level": lvl, "fits": fits, "not_fitted": skipped,
        "runs": [{"path": r.path, "ratio": r.ratio, "replay_share": r.replay_share, "params": r.params,
                  "eval_points": len(r.tokens), "max_tokens": float(r.tokens.max())} for r in runs],
    }, laws


# --- the outputs ------------------------------------------------------------------------------------


def _f(x: Any, nd: int = 4) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def report_md(ans: dict[str, Any]) -> str:
    c = ans["constraint"]
    lines = ["# cptkit plan", "",
             f"{len(ans['runs'])} runs, {len({r['ratio'] for r in ans['runs']})} domain shares; target "
             f"{ans['target_tokens']:,.0f} tokens ({ans['extrapolation']:.1f}× the most any run trained).", "",
             f"Constraint: {', '.join(f'{k}={v}' for k, v in c.items())}.", "",
             f"**Recommended domain share: {_f(ans['recommended_ratio'], 3)}** ({ans['why']}).", ""]
    if ans.get("warnings"):
        lines += [*(f"**Warning:** {w}." for w in ans["warnings"]), ""]
    if ans["predicted"]:
        lines += [f"| loss | predicted | {int(ans['level'] * 100)}% interval | forgetting |", "|---|---|---|---|"]
        for g, p in ans["predicted"].items():
            iv = p["interval"]
            lines.append(f"| {g} | {_f(p['loss'])} | {_f(iv[0])} – {_f(iv[1])} | {_f(p.get('forgetting'))} |")
        lines.append("")
    lines += [f"CMR on {ans['cmr']['measure']} (forgetting ≤ {ans['cmr']['tolerance']:g} nats):", "",
              "| tokens | CMR |", "|---|---|"]
    lines += [f"| {p['tokens']:,.0f} | {_f(p['cmr'], 3)} |" for p in ans["cmr"]["curve"]]
    lines += ["", "Fitted constants (L = E + A/N^α + B·r^η/D^β + C/(r+ε)^γ):", "",
              "| loss | " + " | ".join(dcpt.PARAMS) + " | rmse |", "|---" * (len(dcpt.PARAMS) + 2) + "|"]
    for g, f in ans["fits"].items():
        lines.append(f"| {g} | " + " | ".join(f"{f['constants'][p]:.4g}" for p in dcpt.PARAMS) + f" | {f['rmse']:.4f} |")
    return "\n".join(lines) + "\n"


def prediction_yaml(ans: dict[str, Any], cfg: PlanConfig) -> str:
    """The predictions at ``plan.predict_ratios``, with the runs they were fitted on: the file a
    check commits before its held-out runs train (``make plan-experiment``, docs/plan.md)."""
    import yaml  # deferred: only when predictions are asked for

    def num(x: Any) -> Any:
        return None if x is None else round(float(x), 5)

    doc = {"target_tokens": ans["target_tokens"], "level": ans["level"], "domain": cfg.domain,
           "forgetting_measure": cfg.forgetting_measure,
           "grid": [{"run": r["path"], "ratio": num(r["ratio"]), "max_tokens": r["max_tokens"]} for r in ans["runs"]],
           "predictions": [{"ratio": num(p["ratio"]),
                            **{g: {k: ([num(x) for x in v] if isinstance(v, list) else num(v)) for k, v in p[g].items()}
                               for g in ans["fits"]}} for p in ans["predictions"]]}
    head = ("# cptkit plan's pre-registered prediction: commit this file before the held-out runs train\n"
            "# (make plan-experiment refuses to train them while it is uncommitted; docs/plan.md)\n")
    return head + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def figure_png(runs: list[RunData], ans: dict[str, Any], laws: dict, cfg: PlanConfig) -> bytes:
    """One panel per fitted loss: the observed points by domain share, the law's curves through them
    and on to the target tokens."""
    import matplotlib  # deferred: ~0.3 s, for the figure only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: as above
    import matplotlib.ticker  # deferred: as above

    groups = list(ans["fits"])
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    ratios = sorted({r.ratio for r in runs})
    cmap = plt.get_cmap("viridis")
    N = ans["model_params"]
    t_hi = max(cfg.target_tokens, max(float(r.tokens.max()) for r in runs))
    t_lo = min(float(r.tokens.min()) for r in runs)
    D = np.geomspace(t_lo, t_hi, 100)
    for ax, g in zip(axes[0], groups, strict=True):
        for i, rr in enumerate(ratios):
            col = cmap(i / max(len(ratios) - 1, 1))
            for r in runs:
                if r.ratio == rr:
                    ax.scatter(r.tokens, r.losses[g], s=9, color=col)
            ax.plot(D, laws[g][0](D, rr, N), color=col, lw=1, label=f"r={rr:.2f}")
        if ans["recommended_ratio"] is not None:
            ax.plot(D, laws[g][0](D, ans["recommended_ratio"], N), color="red", lw=1.4, ls="--",
                    label=f"recommended r={ans['recommended_ratio']:.2f}")
        ax.axvline(cfg.target_tokens, color="grey", lw=0.8, ls=":")
        if g == cfg.forgetting_measure and cfg.target_domain_loss is None:  # the constraint's ceiling
            ax.axhline(ans["fits"][g]["base_loss"] + cfg.max_forgetting, color="red", lw=0.8, ls=":",
                       label=f"base + {cfg.max_forgetting:g}")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("tokens")
        ax.set_ylabel("held-out loss")
        ax.set_title(f"{g} ({ans['fits'][g]['role']})", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def print_answer(ans: dict[str, Any]) -> None:

    t = Table(title=f"cptkit plan: recommended domain share {_f(ans['recommended_ratio'], 3)} at "
                    f"{ans['target_tokens']:,.0f} tokens", show_header=True, header_style="bold")
    for col in ("loss", "role", "predicted", f"{int(ans['level'] * 100)}% interval", "forgetting", "fit rmse"):
        t.add_column(col)
    for g, f in ans["fits"].items():
        p = (ans["predicted"] or {}).get(g) or {}
        iv = p.get("interval") or [None, None]
        t.add_row(g, f["role"], _f(p.get("loss")), f"{_f(iv[0])} – {_f(iv[1])}", _f(p.get("forgetting")),
                  f"{f['rmse']:.4f}")
    console.print(t)
    console.print(ans["why"])
    console.print("CMR: " + ", ".join(f"{p['tokens']:,.0f}→{_f(p['cmr'], 2)}" for p in ans["cmr"]["curve"]))


@step("plan", PlanJob, options=(IN, OUT, QUIET), order=145)
def run(conf: PlanJob, ctx: Run) -> dict:
    cfg = conf.plan
    if not conf.io.inputs:
        raise CptkitError("plan: pass the finished train runs: --in 'runs/*/'")
    if conf.io.output in (None, "-"):
        raise CptkitError("plan: pass --out DIR for plan.json, plan.md and plan.png")
    if cfg.target_tokens <= 0:
        raise CptkitError("plan: give the planned run's tokens: plan.target_tokens=N")
    runs = [read_run(d, cfg) for d in run_dirs(list(conf.io.inputs))]
    ratios = sorted({round(r.ratio, 6) for r in runs})
    if len(ratios) < cfg.min_ratios:
        raise CptkitError(f"plan: {len(ratios)} distinct domain shares ({', '.join(f'{x:g}' for x in ratios)}) in "
                          f"{len(runs)} runs; the law needs ≥ {cfg.min_ratios} (plan.min_ratios)")
    reads = [str(Path(r.path) / f) for r in runs for f in ("metrics.jsonl", "_manifest.json")]
    with Job(ctx, tasks=[Task(0, [], name="plan")], needs_inputs=False, reads=reads) as job:
        ans: dict[str, Any] = {}
        for task in job.pending():
            ans, laws = plan_answer(runs, cfg, conf.seed)
            job.write_json(RESULTS, ans | {"config": job.config})
            job.write_bytes(REPORT, report_md(ans).encode())
            job.write_bytes(FIGURE, figure_png(runs, ans, laws, cfg))
            files = [RESULTS, REPORT, FIGURE]
            if cfg.predict_ratios:
                job.write_bytes(PREDICTION, prediction_yaml(ans, cfg).encode())
                files.append(PREDICTION)
            job.complete(task, result=TaskResult(files=files))
        if not ans and job.file(RESULTS).exists():
            ans = json.loads(job.file(RESULTS).read_text())
        if ans and not job.quiet:
            print_answer(ans)
        return job.finish(extra={"runs": len(runs), "domain shares": len(ratios),
                                 "recommended ratio": ans.get("recommended_ratio")})
