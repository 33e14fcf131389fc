"""plan-check: score a pre-registered `cptkit plan` prediction on held-out runs against two naive baselines

``cptkit plan-check --in 'heldout/*/' --out check/ plan_check.prediction=conf/plan/prediction.yaml``

The prediction file (``cptkit plan plan.predict_ratios=[...]``'s ``prediction.yaml``, committed before
the held-out runs trained) names the grid runs the law was fitted on and the losses it predicted, with
intervals, at a token count and domain shares. Each held-out run (a finished train run) is matched to
the predicted share of its stream (within ``plan_check.ratio_tolerance``); its loss at its last eval
point, averaged over the runs at that share, is what each predictor is scored against:

* the law: the pre-registered loss;
* last observed: the grid's loss at its last eval point, at the held-out share (linear between the two
  nearest grid shares when the share is not in the grid);
* log-linear: at each grid share a straight line in log-tokens through its eval points, carried to the
  held-out tokens, then linear between the two nearest shares.

The law is called useful when its absolute error is below both baselines' on the domain loss and on
the forgetting measure. Outputs: ``check.json``, ``check.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.output import TaskResult
from cptkit.core.progress import console
from cptkit.core.run import Run
from cptkit.core.step import IN, OUT, QUIET, step
from cptkit.steps.plan import PlanConfig, RunData, read_run, run_dirs

RESULTS, REPORT = "check.json", "check.md"


@dataclass
class PlanCheckConfig:
    prediction: str = ""  # the committed prediction.yaml of `cptkit plan plan.predict_ratios=[...]`
    general: list[str] = field(default_factory=lambda: ["general"])  # stream domains that are old data
    ratio_tolerance: float = 0.02  # a held-out run's share must be this close to a predicted one

    def __post_init__(self) -> None:
        check(0 < self.ratio_tolerance < 0.5, "ratio_tolerance", self.ratio_tolerance, "must be in (0, 0.5)")


@dataclass
class PlanCheckJob(JobConfig):
    plan_check: PlanCheckConfig = field(default_factory=PlanCheckConfig)


def load_prediction(path: str) -> dict[str, Any]:
    import yaml  # deferred: only this step reads YAML itself

    p = Path(path)
    if not p.is_file():
        raise CptkitError(f"plan_check.prediction={path}: no such file (cptkit plan plan.predict_ratios=[...] "
                          "writes prediction.yaml)")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise CptkitError(f"{p}: line {mark.line + 1 if mark else '?'}: not YAML ({getattr(e, 'problem', e)})") from None
    for key in ("target_tokens", "domain", "forgetting_measure", "grid", "predictions"):
        if not isinstance(doc, dict) or key not in doc:
            raise CptkitError(f"{p}: no {key!r} (not a cptkit plan prediction.yaml)")
    return doc


def interp(ratio: float, by_ratio: dict[float, float]) -> float:
    """Linear in the domain share between the two nearest grid shares (the nearest, outside them)."""
    xs = sorted(by_ratio)
    return float(np.interp(ratio, xs, [by_ratio[x] for x in xs]))


def baselines(grid: list[RunData], group: str, tokens: float) -> dict[str, dict[float, float]]:
    """Per grid share: its last observed loss, and its log-linear fit's loss at ``tokens``."""
    last: dict[float, list[float]] = {}
    pts: dict[float, tuple[list[float], list[float]]] = {}
    for r in grid:
        key = round(r.ratio, 6)
        last.setdefault(key, []).append(float(r.losses[group][-1]))
        xs, ys = pts.setdefault(key, ([], []))
        xs += list(np.log(r.tokens))
        ys += list(r.losses[group])
    line = {}
    for k, (xs, ys) in pts.items():
        slope, icept = np.polyfit(xs, ys, 1)
        line[k] = float(icept + slope * np.log(tokens))
    return {"last observed": {k: float(np.mean(v)) for k, v in last.items()}, "log-linear": line}


def score(pred: dict[str, Any], held: list[RunData], grid: list[RunData], cfg: PlanCheckConfig) -> dict[str, Any]:
    groups = [pred["domain"], pred["forgetting_measure"]]
    rows = []
    for p in pred["predictions"]:
        mine = [r for r in held if abs(r.ratio - float(p["ratio"])) <= cfg.ratio_tolerance]
        if not mine:
            continue
        tokens = float(np.mean([r.tokens[-1] for r in mine]))
        for g in groups:
            observed = float(np.mean([r.losses[g][-1] for r in mine]))
            base = baselines(grid, g, tokens)
            law = float(p[g]["loss"])
            lo, hi = p[g].get("interval") or [None, None]
            errs = {"law": abs(law - observed)} | {k: abs(interp(float(p["ratio"]), v) - observed)
                                                    for k, v in base.items()}
            rows.append({"ratio": float(p["ratio"]), "runs": [r.path for r in mine], "tokens": tokens, "loss": g,
                         "observed": observed, "law": law, "interval": [lo, hi],
                         "in_interval": None if lo is None else bool(lo <= observed <= hi),
                         "last observed": interp(float(p["ratio"]), base["last observed"]),
                         "log-linear": interp(float(p["ratio"]), base["log-linear"]), "abs_error": errs,
                         "law_best": errs["law"] < min(errs["last observed"], errs["log-linear"])})
    if not rows:
        want = ", ".join(f"{float(p['ratio']):g}" for p in pred["predictions"])
        have = ", ".join(sorted({f"{r.ratio:.3f}" for r in held}))
        raise CptkitError("plan-check: no held-out run's domain share is within plan_check.ratio_tolerance="
                          f"{cfg.ratio_tolerance:g} of a predicted one "
                          f"({want}); the runs have {have}")
    useful = all(r["law_best"] for r in rows)
    return {"useful": useful, "rows": rows, "target_tokens": pred["target_tokens"],
            "verdict": ("the law beat both baselines on every held-out loss" if useful else
                        "the law did not beat both baselines on every held-out loss: not shown useful here")}


def report_md(res: dict[str, Any]) -> str:
    lines = ["# cptkit plan-check", "", f"**{res['verdict']}**", "",
             "| share | tokens | loss | observed | law (interval) | last observed | log-linear | |law−obs| | "
             "|last−obs| | |line−obs| |", "|---" * 10 + "|"]
    for r in res["rows"]:
        iv = r["interval"]
        ivs = "" if iv[0] is None else f" ({iv[0]:.4f}–{iv[1]:.4f})"
        e = r["abs_error"]
        lines.append(f"| {r['ratio']:.3f} | {r['tokens']:,.0f} | {r['loss']} | {r['observed']:.4f} | "
                     f"{r['law']:.4f}{ivs} | {r['last observed']:.4f} | {r['log-linear']:.4f} | {e['law']:.4f} | "
                     f"{e['last observed']:.4f} | {e['log-linear']:.4f} |")
    return "\n".join(lines) + "\n"


@step("plan-check", PlanCheckJob, options=(IN, OUT, QUIET), order=146)
def run(conf: PlanCheckJob, ctx: Run) -> dict:
    cfg = conf.plan_check
    if not conf.io.inputs:
        raise CptkitError("plan-check: pass the held-out train runs: --in 'heldout/*/'")
    if conf.io.output in (None, "-"):
        raise CptkitError("plan-check: pass --out DIR for check.json and check.md")
    if not cfg.prediction:
        raise CptkitError("plan-check: give the committed prediction: plan_check.prediction=FILE")
    pred = load_prediction(cfg.prediction)
    pcfg = PlanConfig(target_tokens=float(pred["target_tokens"]), domain=pred["domain"], general=cfg.general,
                      forgetting_measure=pred["forgetting_measure"], min_points=2)
    held = [read_run(d, pcfg) for d in run_dirs(list(conf.io.inputs))]
    grid = [read_run(Path(g["run"]), pcfg) for g in pred["grid"]]
    reads = [cfg.prediction] + [str(Path(r.path) / "metrics.jsonl") for r in held + grid]
    with Job(ctx, tasks=[Task(0, [], name="check")], needs_inputs=False, reads=reads) as job:
        res: dict[str, Any] = {}
        for task in job.pending():
            res = score(pred, held, grid, cfg)
            job.write_json(RESULTS, res | {"config": job.config})
            job.write_bytes(REPORT, report_md(res).encode())
            job.complete(task, result=TaskResult(files=[RESULTS, REPORT]))
        if not res and job.file(RESULTS).exists():
            res = json.loads(job.file(RESULTS).read_text())
        if res and not job.quiet:
            console.print(report_md(res))
        return job.finish(extra={"held-out runs": len(held), "useful": res.get("useful")})
