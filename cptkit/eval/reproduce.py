"""The papers' claims against sweep outputs: aggregate members over seeds, compare, give a verdict.

``python -m cptkit.eval.reproduce CLAIMS.yaml --out docs/reproductions.md`` reads each claim's
sweep members (output directories of a Hydra ``-m`` run), takes the claim's metric from each,
groups members by the ablation axis and pairs them by seed, and writes per claim: the paper's
words, the sweep's command, a table (mean ± SE over seeds), a plot, the comparisons the claim
implies and a verdict by the rule fixed in :mod:`cptkit.eval.stats` before any run: a comparison
*holds* when mean ± 2 SE of its paired difference excludes zero in the paper's direction,
*contradicts* when it excludes zero the other way, and is *inconclusive* otherwise. A claim holds
when all its comparisons hold and is contradicted when any is.

A claim in the YAML::

    - id: corruption
      title: SynE, corruption of synthetic data
      source: "Llama-3-SynE Fig. 2, Tables 8-9"
      quote: "..."
      command: "cptkit corrupt ... -m +sweep=corrupt_ratio corrupt.seed=1,2,3"
      members: "runs/corrupt/*"            # glob, relative to the YAML's directory or --root
      axis: corrupt.ratio                   # dotted key in each member's _manifest.json config
      seed: corrupt.seed
      metric: {file: _manifest.json, path: [extra, realised ratio], label: realised ratio}
      compare: [{a: 0.5, b: 0.0, expect: 1}]   # metric(a) - metric(b) is expected to be > 0
      # optional: where axis and seed are read (default: the member's _manifest.json, key config),
      # e.g. the config of an upstream step recorded in a metric file
      config: {file: _relevance.json, path: [queries, config]}
      # optional: more metrics shown as table columns (mean ± SE), without a verdict
      report: [{file: _relevance.json, path: [all, precision], label: precision}]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.eval.stats import CONTRADICTS, HOLDS, INCONCLUSIVE, Effect, effect, mean_se


@dataclass
class Claim:
    """One paper claim, the sweep that tests it, and the comparisons that decide it."""

    id: str
    title: str
    source: str
    quote: str
    command: str
    members: str
    axis: str
    seed: str
    metric: dict[str, Any]
    compare: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    config: dict[str, Any] | None = None  # {file, path}: where axis and seed are read (default: _manifest.json config)
    report: list[dict[str, Any]] = field(default_factory=list)  # more metrics {file, path, label}: columns, no verdict


def dotted(obj: Any, path: str | Sequence[str]) -> Any:
    """``obj[a][b]...`` for ``"a.b"`` or ``["a", "b"]`` (a key may contain dots when given as a list)."""
    keys = path.split(".") if isinstance(path, str) else list(path)
    for k in keys:
        if not isinstance(obj, dict) or k not in obj:
            raise KeyError(k)
        obj = obj[k]
    return obj


def member_point(d: Path, claim: Claim, metric: dict[str, Any] | None = None) -> tuple[Any, Any, float]:
    """``(axis value, seed, metric)`` of one sweep member's output directory (``metric``: another
    of the claim's metrics than ``claim.metric``)."""
    metric = metric or claim.metric
    man_path = d / "_manifest.json"
    if not (d / "_SUCCESS").exists() or not man_path.exists():
        raise CptkitError(f"{d}: not a finished step output (no _SUCCESS/_manifest.json): rerun the sweep")
    where = claim.config or {"file": "_manifest.json", "path": ["config"]}
    src = d / metric["file"]
    try:
        config = dotted(json.loads((d / where["file"]).read_text()), where["path"])
        value = float(dotted(json.loads(src.read_text()), metric["path"]))
        return dotted(config, claim.axis), dotted(config, claim.seed), value
    except FileNotFoundError as e:
        raise CptkitError(f"{e.filename}: missing (claim {claim.id})") from None
    except KeyError as e:
        raise CptkitError(f"{d}: no {e.args[0]!r} for claim {claim.id} (axis {claim.axis}, seed {claim.seed}, "
                          f"metric {metric['path']})") from None


def collect(claim: Claim, root: Path, metric: dict[str, Any] | None = None) -> dict[Any, dict[Any, float]]:
    """``{axis value: {seed: metric}}`` over every member of the claim's sweep."""
    dirs = sorted(Path(p) for p in glob.glob(str(root / claim.members)) if Path(p).is_dir())
    if not dirs:
        raise CptkitError(f"claim {claim.id}: no sweep member matches {root / claim.members}: run `{claim.command}`")
    points: dict[Any, dict[Any, float]] = {}
    for d in dirs:
        x, s, v = member_point(d, claim, metric)
        if s in points.setdefault(x, {}):
            raise CptkitError(f"claim {claim.id}: two members with {claim.axis}={x}, {claim.seed}={s} ({d})")
        points[x][s] = v
    return points


def compare(points: dict[Any, dict[Any, float]], a: Any, b: Any, expect: int) -> Effect:
    """The paired (by seed) effect metric(a) − metric(b) with its verdict."""
    for x in (a, b):
        if x not in points:
            raise CptkitError(f"no member with axis value {x} (have {sorted(points, key=str)})")
    seeds = sorted(set(points[a]) & set(points[b]), key=str)
    if not seeds:
        raise CptkitError(f"axis values {a} and {b} share no seed: nothing to pair")
    return effect([points[a][s] - points[b][s] for s in seeds], expect)


def claim_verdict(effects: Sequence[Effect]) -> str:
    """All comparisons hold: holds; any contradicts: contradicts; otherwise inconclusive."""
    if effects and all(e.verdict == HOLDS for e in effects):
        return HOLDS
    if any(e.verdict == CONTRADICTS for e in effects):
        return CONTRADICTS
    return INCONCLUSIVE


def plot(points: dict[Any, dict[Any, float]], claim: Claim, out: Path) -> bool:
    """Mean ± SE of the metric against the axis (a PNG); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = sorted(points, key=lambda v: (isinstance(v, str), v))
    stats = [mean_se(list(points[x].values())) for x in xs]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    pos = list(range(len(xs))) if any(isinstance(x, str) for x in xs) else xs
    ax.errorbar(pos, [m for m, _ in stats], yerr=[0 if se != se else se for _, se in stats], marker="o", capsize=4)
    if pos is not xs:
        ax.set_xticks(pos, [str(x) for x in xs])
    ax.set_xlabel(claim.axis)
    ax.set_ylabel(claim.metric.get("label", str(claim.metric["path"])))
    ax.set_title(f"{claim.title} (mean ± SE over seeds)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return True


def section(n: int, claim: Claim, root: Path, figdir: Path, doc_dir: Path) -> tuple[str, str]:
    """The markdown of one claim and its verdict."""
    points = collect(claim, root)
    extra = [collect(claim, root, m) for m in claim.report]
    label = claim.metric.get("label", str(claim.metric["path"]))
    labels = [label, *(m.get("label", str(m["path"])) for m in claim.report)]
    lines = [f"## {n}. {claim.title}", "", f"> {claim.quote}", f"> — {claim.source}", "",
             f"Sweep: `{claim.command}`", "", f"| {claim.axis} | seeds | "
             + " | ".join(f"{lb} (mean ± SE)" for lb in labels) + " |", "|---|---|" + "---|" * len(labels)]

    def cell(values: list[float]) -> str:
        m, se = mean_se(values)
        return f"{m:.4f}" + ("" if se != se else f" ± {se:.4f}")

    for x in sorted(points, key=lambda v: (isinstance(v, str), v)):
        lines.append(f"| {x} | {len(points[x])} | " + " | ".join(cell(list(p[x].values())) for p in [points, *extra])
                     + " |")
    lines += ["", "| comparison | expected | difference (mean ± SE) | interval (± 2 SE) | verdict |",
              "|---|---|---|---|---|"]
    effects = []
    for c in claim.compare:
        e = compare(points, c["a"], c["b"], int(c["expect"]))
        effects.append(e)
        interval = "–" if e.lo != e.lo else f"[{e.lo:+.4f}, {e.hi:+.4f}]"
        lines.append(f"| {label}({c['a']}) − {label}({c['b']}) | {'> 0' if c['expect'] > 0 else '< 0'} | "
                     f"{e.text(4)} | {interval} | {e.verdict} |")
    verdict = claim_verdict(effects)
    lines += ["", f"**Verdict: {verdict}.**" + (f" {claim.note}" if claim.note else "")]
    png = figdir / f"{claim.id}.png"
    if plot(points, claim, png):
        lines += ["", f"![{claim.title}]({png.relative_to(doc_dir) if png.is_relative_to(doc_dir) else png})"]
    return "\n".join(lines) + "\n", verdict


def load_claims(path: Path) -> list[Claim]:
    import yaml

    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [Claim(**c) for c in items]
    except (OSError, yaml.YAMLError, TypeError) as e:
        raise CptkitError(f"{path}: {e}") from None


def report(claims_file: Path, out: Path, root: Path | None = None, header: str = "") -> list[tuple[str, str]]:
    """Write the report of every claim to ``out``; returns ``[(claim id, verdict)]``."""
    from cptkit.core.shards import atomic_write_bytes

    claims = load_claims(claims_file)
    root = root or claims_file.parent
    figdir = out.parent / out.stem
    parts, verdicts = [header] if header else [], []
    for n, claim in enumerate(claims, 1):
        text, verdict = section(n, claim, root, figdir, out.parent)
        parts.append(text)
        verdicts.append((claim.id, verdict))
    summary = ["| claim | verdict |", "|---|---|", *(f"| {i} | {v} |" for i, v in verdicts)]
    atomic_write_bytes(out, ("\n".join(summary) + "\n\n" + "\n".join(parts)).encode())
    return verdicts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cptkit.eval.reproduce", description=__doc__.splitlines()[0])
    p.add_argument("claims", type=Path, help="the claims YAML")
    p.add_argument("--out", type=Path, required=True, help="the markdown report to write")
    p.add_argument("--root", type=Path, default=None, help="where member globs start (default: the YAML's folder)")
    p.add_argument("--header", default="", help="text above the claims (date, machine, wall time)")
    a = p.parse_args(argv)
    try:
        verdicts = report(a.claims, a.out, a.root, a.header)
    except CptkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for cid, v in verdicts:
        print(f"{cid}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
