"""The papers' claims against sweep outputs: aggregate members over seeds, compare, give a verdict.

``cptkit reproduce-report CLAIMS.yaml --out docs/reproductions.md`` reads each claim's
sweep members (output directories of a Hydra ``-m`` run), takes the claim's metric from each,
groups members by the ablation axis and pairs them by seed, and writes per claim: the paper's
words, the sweep's command, a table (mean ± SE over seeds), a plot, the comparisons the claim
implies and a verdict by the rule of :mod:`cptkit.eval.stats`, fixed before any run: each claim's one
*primary* comparison (``primary:``; pre-registered with its minimum effect, or as an equivalence
with a TOST margin) is a paired t test over seeds at n − 1 df, Holm-adjusted over the primary
comparisons of every claim in the report; it *holds*, *contradicts*, is *inconclusive*, or is *not
testable here* (one seed, a measure that cannot move, or a claim declared ``not_testable: WHY``,
e.g. one that needs a GPU; ``--gpu NAME`` decides a claim that "needs a GPU" when its members were
made on one: bench/gpu/reproduce.sh). ``compare:`` items beside a primary are secondary: shown, decided
alone, and never the verdict. A comparison is ``metric(a) − metric(b)`` or a ``contrast:
{axis value: weight}`` (a peak at 0.2: ``{0.2: 2, 0.1: -1, 0.4: -1}``).

Members that are not there: a claim declared ``not_testable`` with none (the GPU's claim on a CPU) is
reported as *not testable here* with its reason; any other claim without finished members fails the
report, or with ``--partial`` is reported as *not run yet* (why, and its command), so that a page can
be written while sweeps are still to run.

Readings: ``--readings FILE`` (YAML, written *after* a run, apart from the pre-registered claims)
maps a claim id to ``{measured: DIGEST, text: ...}``, the prose under its verdict. ``DIGEST`` is
:func:`measured_digest` of the numbers it was written for (the report prints each claim's); a reading
whose digest is not the members' now is not shown, and its section says so: a rerun never keeps a
reading of other numbers.

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
      primary: {a: 0.7, b: 0.0, expect: 1, min_effect: 0.02}   # metric(a) - metric(b) > 0.02
      control: "..."                        # what makes the effect have one cause
      could_fail: "..."                     # why the measure could have gone against the paper

Several metrics: ``metrics: {name: {file, path, label, ...}}`` (``compare`` items then name theirs:
``{metric: name, ...}``) and ``frontier: [x_metric, y_metric]`` for a trade-off plot. A metric
``file`` ending in ``.jsonl`` is read at its last line whose ``event`` is the metric's ``event``
(``metrics.jsonl``'s final held-out losses: ``event: eval``); ``reduce: mean | max | min`` reduces
a mapping at ``path`` over its values (``keys``: only these; ``prefix``: only keys starting so);
``digits``: decimals in the table (default 4).
An axis or seed key that the member's config lacks is read from the member directory's name when
it has Hydra's override_dirname form (``method=rm3,keyword=text-processing``: ``axis: method``,
``seed: keyword``; cptkit's own ``-m`` members without a ``{key}`` in ``--out`` are named so).
An axis or seed key ``input:KEY`` is read from the config of the member's first input (a train
run's stream: ``input:mix.replay.share``); ``config: {file, path}`` reads the member's config from
another file than ``_manifest.json`` (an upstream step's config that a metric's writer recorded).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.output import is_finished
from cptkit.core.records import read_jsonl
from cptkit.core.shards import atomic_write_bytes
from cptkit.eval.stats import (
    NOT_TESTABLE,
    Comparison,
    Effect,
    claim_verdict,
    decide,
    mean_se,
    paired_t,
    tost,
)
from cptkit.mixtures.rules import velocities


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
    metric: dict[str, Any] | None = None
    compare: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    frontier: list[str] | None = None
    trajectories: dict[str, Any] | None = None  # {file: weights.jsonl, seed: S}: each arm's mixture weights
    axis_label: str = ""  # the axis as tables and plots name it (default: the axis key)
    config: dict[str, Any] | None = None  # {file, path}: where axis and seed are read (default: _manifest.json config)
    primary: dict[str, Any] | None = None  # the one pre-registered comparison that decides the claim
    control: str = ""  # the control arm that gives the effect one cause
    could_fail: str = ""  # why the measure could have gone against the paper
    not_testable: str = ""  # a reason this design cannot decide the claim here (e.g. "needs a GPU")
    scale: str = ""  # the model and the tokens per arm (or queries) the verdict is about; the machine is added

    def __post_init__(self) -> None:
        if self.metric is not None:
            self.metrics = {"metric": self.metric, **self.metrics}
        if not self.metrics:
            raise CptkitError(f"claim {self.id}: give metric or metrics")
        for c in self.compare + ([self.primary] if self.primary else []):
            if c.get("metric", self.first) not in self.metrics:
                raise CptkitError(f"claim {self.id}: compare names metric {c['metric']!r}; have {', '.join(self.metrics)}")
        for m in self.frontier or []:
            if m not in self.metrics:
                raise CptkitError(f"claim {self.id}: frontier names metric {m!r}; have {', '.join(self.metrics)}")

    @property
    def axis_name(self) -> str:
        return self.axis_label or self.axis.removeprefix("input:")

    @property
    def first(self) -> str:
        return next(iter(self.metrics))

    def label(self, name: str) -> str:
        m = self.metrics[name]
        return str(m.get("label", m["path"] if name == "metric" else name))


def dotted(obj: Any, path: str | Sequence[str]) -> Any:
    """``obj[a][b]...`` for ``"a.b"`` or ``["a", "b"]`` (a key may contain dots when given as a list; a
    number indexes a list)."""
    keys = path.split(".") if isinstance(path, str) else list(path)
    for k in keys:
        if isinstance(obj, list) and str(k).isdigit() and int(k) < len(obj):  # mix.stages.0.weights
            obj = obj[int(k)]
            continue
        if not isinstance(obj, dict) or k not in obj:
            raise KeyError(k)
        obj = obj[k]
    return obj


def has(obj: Any, path: str | Sequence[str]) -> bool:
    try:
        dotted(obj, path)
        return True
    except KeyError:
        return False


def load(path: Path, files: dict[Path, Any]) -> Any:
    """``path`` parsed (JSON, or a list of JSON lines), once per ``files`` cache."""
    if path not in files:
        if not path.exists():
            raise FileNotFoundError(2, "No such file", str(path))
        files[path] = read_jsonl(path) if path.suffix == ".jsonl" else json.loads(path.read_text())
    return files[path]


def read_metric(d: Path, spec: dict[str, Any], root: Path | None = None, files: dict[Path, Any] | None = None) -> float:
    """One metric of one member: a JSON file's value at ``path`` (a ``.jsonl``: its last line whose
    ``event`` is ``spec['event']``), reduced over a mapping's values when ``reduce`` is given. ``files``
    caches parsed files, so a member's metrics read each file once."""
    files = {} if files is None else files
    src = d / spec["file"]
    first: dict[str, Any] = {}
    if src.suffix == ".jsonl":
        lines = load(src, files)
        rows = [r for r in lines if r.get("event") == spec.get("event")]
        if not rows:
            raise KeyError(f"event {spec.get('event')!r} in {spec['file']}")
        obj = rows[-1]
        first = next((r for r in lines if has(r, spec["path"])), obj)  # train: step 0's eval is on a step line
    else:
        obj = load(src, files)
    value = dotted(obj, spec["path"])
    how = spec.get("reduce")
    if how is None:
        return float(value)
    if how in ("velocity_spread", "velocity_max"):  # Velocitune's V per domain, from the first and last eval
        if src.suffix != ".jsonl":
            raise CptkitError(f"reduce: {how} reads the first and last eval of a .jsonl file, not {spec['file']}")
        targets = load((root or d) / spec["targets"], files)["targets"]
        return velocity_metric(first, value, targets, how)
    keys = [k for k in value if k in spec.get("keys", value) and str(k).startswith(spec.get("prefix", ""))]
    if not keys:
        raise KeyError(f"{spec['path']} has no key to reduce (keys {spec.get('keys')}, prefix {spec.get('prefix')!r})")
    vals = [float(value[k]) for k in keys]
    reducers = {"mean": lambda v: sum(v) / len(v), "max": max, "min": min}
    if how not in reducers:
        raise CptkitError(f"reduce: {how!r}: use mean, max or min")
    return reducers[how](vals)


def velocity_metric(first: dict[str, Any], last: Mapping[str, float], targets: Mapping[str, float], how: str,
                    path: Sequence[str] = ("eval_loss",)) -> float:
    """The spread (max − min) or the largest of the learning velocities V = (ℓ_t − ℓ_target) /
    (ℓ_init − ℓ_target) (Velocitune Eq. 2) at the last eval, ℓ_init the first line's (step 0's) loss and
    ℓ_target the proxy's targets (a ``_velocitune_targets.json``'s ``targets``)."""

    init = dotted(first, path)
    v = velocities(init, {d: float(targets[d]) for d in last}, last)
    return max(v.values()) - min(v.values()) if how == "velocity_spread" else max(v.values())


def name_items(d: Path) -> dict[str, Any]:
    """The ``KEY=VALUE`` items of a member directory's name in Hydra's override_dirname form
    (``method=rm3,keyword=text-processing``; a value is a number when it reads as one)."""
    out: dict[str, Any] = {}
    for item in d.name.split(","):
        key, eq, value = item.partition("=")
        if eq and key:
            out[key] = _scalar(value)
    return out


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def member_config(d: Path, key: str, config: dict[str, Any]) -> Any:
    """``key`` of a member's config, else of its directory's name (``KEY=VALUE`` items, :func:`name_items`);
    of its first input's config for ``input:KEY``; for ``dir:REGEX``, the regex's first group in the
    member directory's name (a number when it reads as one)."""
    if key.startswith("dir:"):
        m = re.search(key.removeprefix("dir:"), d.name)
        if not m:
            raise KeyError(f"{key} (no match in {d.name!r})")
        import yaml

        return yaml.safe_load(m.group(1))
    if not key.startswith("input:"):
        named = {} if has(config, key) else name_items(d)
        return named[key] if key in named else dotted(config, key)
    inputs = config.get("io", {}).get("inputs") or []
    if not inputs:
        raise KeyError(f"{key} (the member has no input)")
    man = Path(inputs[0]) / "_manifest.json"
    try:
        return dotted(json.loads(man.read_text())["config"], key.removeprefix("input:"))
    except FileNotFoundError:
        raise CptkitError(f"{d}: its input's manifest {man} is missing (for {key})") from None


def member_point(d: Path, claim: Claim, root: Path | None = None,
                 files: dict[Path, Any] | None = None) -> tuple[Any, Any, dict[str, float]]:
    """``(axis value, seed, {metric: value})`` of one sweep member's output directory."""
    man_path = d / "_manifest.json"
    if not is_finished(d) or not man_path.exists():
        raise CptkitError(f"{d}: not a finished step output (no _SUCCESS/_manifest.json): rerun the sweep")
    where = claim.config or {"file": "_manifest.json", "path": ["config"]}
    files = {} if files is None else files
    name = ""
    try:
        config = dotted(load(d / where["file"], files), where["path"])
        x, s = member_config(d, claim.axis, config), member_config(d, claim.seed, config)
        values = {}
        for name, spec in claim.metrics.items():
            values[name] = read_metric(d, spec, root, files)
        return x, s, values
    except FileNotFoundError as e:
        raise CptkitError(f"{e.filename}: missing (claim {claim.id})") from None
    except KeyError as e:
        raise CptkitError(f"{d}: no {e.args[0]!r} for claim {claim.id} (axis {claim.axis}, seed {claim.seed}"
                          + (f", metric {name}" if name else "") + ")") from None


Points = dict[Any, dict[Any, dict[str, float]]]  # {axis value: {seed: {metric: value}}}


def member_dirs(claim: Claim, root: Path) -> list[Path]:
    """The directories the claim's ``members`` glob matches under ``root``, sorted."""
    return sorted(Path(p) for p in glob.glob(str(root / claim.members)) if Path(p).is_dir())


def collect(claim: Claim, root: Path, members: dict[tuple[Any, Any], Path] | None = None,
            files: dict[Path, Any] | None = None) -> Points:
    """``{axis value: {seed: {metric: value}}}`` over every member of the claim's sweep; ``members``
    (if given) receives each point's directory, ``files`` the parsed files (for the plots)."""
    files = {} if files is None else files
    dirs = member_dirs(claim, root)
    if not dirs:
        raise CptkitError(f"claim {claim.id}: no sweep member matches {root / claim.members}: run `{claim.command}`")
    points: Points = {}
    for d in dirs:
        x, s, v = member_point(d, claim, root, files)
        if s in points.setdefault(x, {}):
            raise CptkitError(f"claim {claim.id}: two members with {claim.axis}={x}, {claim.seed}={s} ({d})")
        points[x][s] = v
        if members is not None:
            members[(x, s)] = d
    return points


def contrast_of(c: dict[str, Any]) -> dict[Any, float]:
    """A comparison's weights over axis values: ``{a: 1, b: -1}`` or its ``contrast``."""
    if "contrast" in c:
        return {k: float(w) for k, w in c["contrast"].items()}
    return {c["a"]: 1.0, c["b"]: -1.0}


def paired_diffs(points: Points, c: dict[str, Any], metric: str = "metric") -> list[float]:
    """Per seed (seeds every axis value of the comparison has), Σ weight·metric(axis value)."""
    weights = contrast_of(c)
    for x in weights:
        if x not in points:
            raise CptkitError(f"no member with axis value {x} (have {sorted(points, key=str)})")
    seeds = sorted(set.intersection(*(set(points[x]) for x in weights)), key=str)
    if not seeds:
        raise CptkitError(f"axis values {', '.join(map(str, weights))} share no seed: nothing to pair")
    return [sum(w * points[x][s][metric] for x, w in weights.items()) for s in seeds]


def comparison(c: dict[str, Any]) -> Comparison:
    """The statistics module's view of a YAML comparison (its axis values stay in the YAML)."""
    kind = c.get("kind", "effect")
    return Comparison(metric=str(c.get("metric", "metric")), a="", b="", expect=int(c.get("expect", 1)),
                      min_effect=float(c.get("min_effect", 0.0)), kind=kind, margin=float(c.get("margin", 0.0)))


def decide_alone(c: dict[str, Any], diffs: list[float]) -> Effect:
    """A secondary comparison, decided on its own (no family correction)."""
    cmp_ = comparison(c)
    if cmp_.kind == "equivalence":
        return tost(diffs, cmp_.margin)
    return paired_t(diffs, cmp_.expect, cmp_.min_effect)


def comparison_label(c: dict[str, Any], claim: Claim) -> str:
    metric = c.get("metric", claim.first)
    label = metric if metric != "metric" else claim.label(metric)
    return " ".join(f"{'+' if w > 0 else '−'} {abs(w):g}·{label}({x})" if abs(w) != 1 else
                    f"{'+' if w > 0 else '−'} {label}({x})" for x, w in contrast_of(c).items()).lstrip("+ ")


def expected_text(c: dict[str, Any]) -> str:
    if c.get("kind") == "equivalence":
        return f"within ±{float(c['margin']):g}"
    sign = "> " if int(c.get("expect", 1)) > 0 else "< −"
    return f"{sign}{float(c.get('min_effect', 0.0)):g}" if c.get("min_effect") else ("> 0" if sign == "> " else "< 0")


def axis_order(points: Points) -> list[Any]:
    return sorted(points, key=lambda v: (isinstance(v, str), v))


def stats_of(points: Points, x: Any, metric: str) -> tuple[float, float]:
    return mean_se([v[metric] for v in points[x].values()])


def plot(points: Points, claim: Claim, out: Path) -> bool:
    """Mean ± SE of each metric against the axis, and the frontier plot if asked (a PNG); False
    when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = axis_order(points)
    panels = list(claim.metrics) + (["frontier"] if claim.frontier else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.3), dpi=100, squeeze=False)
    pos = list(range(len(xs))) if any(isinstance(x, str) for x in xs) else xs
    for ax, name in zip(axes[0], panels, strict=True):
        if name == "frontier" and claim.frontier:
            mx, my = claim.frontier
            for x in xs:
                (a, sa), (b, sb) = stats_of(points, x, mx), stats_of(points, x, my)
                ax.errorbar([a], [b], xerr=[0 if sa != sa else sa], yerr=[0 if sb != sb else sb], marker="o", capsize=3)
                ax.annotate(str(x), (a, b), textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax.set_xlabel(claim.label(mx), fontsize=8)
            ax.set_ylabel(claim.label(my), fontsize=8)
            ax.set_title(f"frontier over {claim.axis_name}", fontsize=9)
            continue
        stats = [stats_of(points, x, name) for x in xs]
        ax.errorbar(pos, [m for m, _ in stats], yerr=[0 if se != se else se for _, se in stats], marker="o", capsize=4)
        if pos is not xs:
            ax.set_xticks(pos, [str(x) for x in xs])
        ax.set_xlabel(claim.axis_name, fontsize=8)
        ax.set_ylabel(claim.label(name), fontsize=8)
    fig.suptitle(f"{claim.title} (mean ± SE over seeds)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return True


def plot_trajectories(claim: Claim, members: dict[tuple[Any, Any], Path], files: dict[Path, Any], out: Path) -> bool:
    """Each arm's mixture weights over training steps (one seed), from its ``weights.jsonl`` (``members``:
    the sweep's directories by (axis value, seed), as :func:`collect` found them)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    spec = claim.trajectories or {}
    arms: dict[Any, list[dict[str, Any]]] = {}
    for (x, seed), d in members.items():
        if seed == spec.get("seed", 0):
            rows = [r for r in load(d / spec.get("file", "weights.jsonl"), files) if r.get("weights")]  # staged: none
            if rows:
                arms[x] = rows
    if not arms:
        return False
    fig, axes = plt.subplots(1, len(arms), figsize=(4 * len(arms) + 2.5, 3.4), dpi=100, squeeze=False, sharey=True)
    colors = plt.get_cmap("tab20").colors
    for ax, (arm, rows) in zip(axes[0], sorted(arms.items(), key=lambda kv: str(kv[0])), strict=True):
        for k, dom in enumerate(rows[-1]["weights"]):
            ax.plot([r["step"] for r in rows], [r["weights"].get(dom, 0.0) for r in rows], marker=".", label=dom,
                    color=colors[k % len(colors)])
        ax.set_title(f"{claim.axis_name}={arm}", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    axes[0][0].set_ylabel("mixture weight", fontsize=8)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.subplots_adjust(right=0.72)
    fig.suptitle(f"{claim.title}: weights over training (seed {spec.get('seed', 0)})", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.72, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return True


@dataclass
class Measured:
    """One claim's sweep, read: its points, members and parsed files, and its primary comparison's
    per-seed differences (None when the claim has no primary or is declared not testable)."""

    claim: Claim
    points: Points
    members: dict[tuple[Any, Any], Path]
    files: dict[Path, Any]
    primary: list[float] | None


def measure(claim: Claim, root: Path) -> Measured:
    members: dict[tuple[Any, Any], Path] = {}
    files: dict[Path, Any] = {}
    points = collect(claim, root, members, files)
    diffs = None
    if claim.primary and not claim.not_testable:
        diffs = paired_diffs(points, claim.primary, claim.primary.get("metric", claim.first))
    return Measured(claim, points, members, files, diffs)


def _points_table(m: Measured) -> list[str]:
    claim, names = m.claim, list(m.claim.metrics)
    lines = [f"| {claim.axis_name} | seeds | " + " | ".join(f"{claim.label(k)} (mean ± SE)" for k in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for x in axis_order(m.points):
        cells = []
        for k in names:
            mean, se = stats_of(m.points, x, k)
            digits = int(claim.metrics[k].get("digits", 4))
            cells.append(f"{mean:.{digits}f}" + ("" if se != se else f" ± {se:.{digits}f}"))
        lines.append(f"| {x} | {len(m.points[x])} | " + " | ".join(cells) + " |")
    return lines


def _comparison_rows(m: Measured, primary: Effect | None) -> tuple[list[str], list[Effect]]:
    claim = m.claim
    rows = ["| comparison | role | expected | difference (mean ± SE) | interval | test | verdict |",
            "|---|---|---|---|---|---|---|"]
    items = ([(claim.primary, "primary", primary)] if claim.primary else []) + \
        [(c, "secondary" if claim.primary else "decides", None) for c in claim.compare]
    effects = []
    for c, role, e in items:
        if e is None:
            e = decide_alone(c, paired_diffs(m.points, c, c.get("metric", claim.first)))
        if role != "secondary":
            effects.append(e)
        interval = "–" if e.lo != e.lo else f"[{e.lo:+.4f}, {e.hi:+.4f}]"
        rows.append(f"| {comparison_label(c, claim)} | {role} | {expected_text(c)} | {e.text(4)} | {interval} | "
                    f"{e.test} | {e.verdict}{' (' + e.why() + ')' if e.why() else ''} |")
    return rows, effects


def scale_text(claim: Claim, machine: str) -> str:
    """What a verdict is about: the claim's declared model and tokens per arm, and the machine."""
    return f" (at {claim.scale or 'a scale the claim does not declare'}; {machine})" if machine else ""


def machine_text(gpu: str = "") -> str:
    """``2 CPU cores, no GPU``: the machine a report's members ran on, as each verdict names it."""
    return f"{os.cpu_count()} CPU cores, {gpu or 'no GPU'}"


def section(n: int, m: Measured, primary: Effect | None, figdir: Path, doc_dir: Path,
            machine: str = "") -> tuple[str, str]:
    """The markdown of one claim and its verdict (``primary``: its primary comparison, decided over the
    report's family; ``machine``: named in the verdict with the claim's scale)."""
    claim = m.claim
    lines = [f"## {n}. {claim.title}", "", f"> {claim.quote}", f"> — {claim.source}", "",
             f"Sweep: `{claim.command}`", ""]
    for label, text in (("Control", claim.control), ("Why the measure could have failed", claim.could_fail)):
        if text:
            lines += [f"**{label}:** {text}", ""]
    lines += _points_table(m) + [""]
    if claim.not_testable:
        verdict, effects = NOT_TESTABLE, []
        lines += [f"**Verdict: {NOT_TESTABLE}** ({claim.not_testable})."]
    else:
        rows, effects = _comparison_rows(m, primary)
        verdict = claim_verdict(effects)
        lines += rows + ["", f"**Verdict: {verdict}**{scale_text(claim, machine)}."]
    if claim.note:
        lines[-1] += f" {claim.note}"
    png = figdir / f"{claim.id}.png"
    if plot(m.points, claim, png):
        lines += ["", f"![{claim.title}]({png.relative_to(doc_dir) if png.is_relative_to(doc_dir) else png})"]
    traj = figdir / f"{claim.id}-weights.png"
    if claim.trajectories and plot_trajectories(claim, m.members, m.files, traj):
        lines += ["", f"![{claim.title}: mixture weights]"
                      f"({traj.relative_to(doc_dir) if traj.is_relative_to(doc_dir) else traj})"]
    return "\n".join(lines) + "\n", verdict


def decide_family(measured: list[Measured | None]) -> list[Effect | None]:
    """The primary comparisons of every measured claim, decided together with Holm's correction."""
    idx = [i for i, m in enumerate(measured) if m is not None and m.primary is not None]
    fam = [(comparison(measured[i].claim.primary), measured[i].primary) for i in idx]  # type: ignore[union-attr]
    out: list[Effect | None] = [None] * len(measured)
    for i, e in zip(idx, decide(fam) if fam else [], strict=True):
        out[i] = e
    return out


def load_claims(path: Path) -> list[Claim]:
    import yaml

    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [Claim(**c) for c in items]
    except (OSError, yaml.YAMLError, TypeError) as e:
        raise CptkitError(f"{path}: {e}") from None


NOT_RUN = "not run yet"


NEEDS_GPU = "needs a GPU"


def measured_digest(m: Measured) -> str:
    """What a reading was written for: the claim's points (axis value -> seed -> metrics) as read from its
    members, each value to 6 significant digits (a rerun that changes any member changes it)."""
    def norm(x: Any) -> Any:
        if isinstance(x, Mapping):
            return sorted((str(k), norm(v)) for k, v in x.items())
        return f"{x:.6g}" if isinstance(x, float) else str(x)

    return hashlib.sha256(json.dumps(norm(m.points)).encode()).hexdigest()[:12]


def load_readings(path: Path | None) -> dict[str, dict[str, str]]:
    """``--readings``: claim id -> {measured, text}; a malformed file is a one-line error naming it."""
    if path is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CptkitError(f"{path}: cannot read the readings: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) and {"measured", "text"} <= set(v) for v in data.values()):
        raise CptkitError(f"{path}: expected claim id -> {{measured: DIGEST, text: ...}} for every entry")
    return {str(k): {"measured": str(v["measured"]), "text": str(v["text"]).strip()} for k, v in data.items()}


def reading_text(cid: str, m: Measured, readings: dict[str, dict[str, str]], source: str) -> str:
    """The reading under a measured claim's verdict, or why the one written is not shown."""
    r = readings.get(cid)
    if r is None:
        return ""
    now = measured_digest(m)
    if r["measured"] != now:
        return (f"\n*The reading in {source} was written for other numbers (measured {r['measured']}; these are "
                f"{now}): not shown.*\n")
    return f"\n**Reading** (written after the run, {source}). {r['text']}\n"


def report(claims_file: Path, out: Path, root: Path | None = None, header: str = "",
           partial: bool = False, gpu: bool = False, readings: Path | None = None,
           digests: dict[str, str] | None = None, machine: str = "") -> list[tuple[str, str]]:
    """Write the report of every claim to ``out``; returns ``[(claim id, verdict)]``. ``partial``:
    a claim whose sweep is missing or unfinished is reported as not run (with why and its command)
    instead of failing the report. A claim declared ``not_testable`` whose members are not there (a GPU's
    claim on a CPU) is reported as not testable here, with its reason, whether ``partial`` or not.
    ``gpu``: the members were made on a GPU, so a claim declared not testable only because it ``needs a
    GPU`` is decided like the others (and its missing members are then an error, or not run with ``partial``).
    ``readings``: the prose under each verdict (module docstring), shown only beside the numbers it was written for;
    ``digests`` (filled when given): each measured claim's :func:`measured_digest`, which a reading names.
    ``machine`` (default: this one, :func:`machine_text`): named in every verdict beside the claim's scale."""

    claims = load_claims(claims_file)
    notes = load_readings(readings)
    machine = machine or machine_text("a GPU" if gpu else "")
    for c in claims:
        if gpu and c.not_testable.startswith(NEEDS_GPU):
            c.not_testable = ""
    root = root or claims_file.parent
    figdir = out.parent / out.stem
    measured: list[Measured | None] = []
    why: dict[int, str] = {}
    for i, claim in enumerate(claims):
        if claim.not_testable and not member_dirs(claim, root):  # nothing to read, nothing to decide
            measured.append(None)
            why[i] = f"no member matches {root / claim.members} here"
            continue
        try:
            measured.append(measure(claim, root))
        except CptkitError as e:
            if not partial:
                raise
            measured.append(None)
            why[i] = str(e)
    primaries = decide_family(measured)
    parts, verdicts = [], []
    for n, (claim, m, e) in enumerate(zip(claims, measured, primaries, strict=True), 1):
        if m is None:
            head = f"## {n}. {claim.title}\n\n> {claim.quote}\n> — {claim.source}\n\nSweep: `{claim.command}`\n\n"
            if claim.not_testable:
                text, verdict = head + f"**Verdict: {NOT_TESTABLE}** ({claim.not_testable}); {why[n - 1]}.\n", NOT_TESTABLE
            else:
                text, verdict = head + f"**{NOT_RUN}:** {why[n - 1]}\n", NOT_RUN
        else:
            text, verdict = section(n, m, e, figdir, out.parent, machine)
            text += reading_text(claim.id, m, notes, readings.name if readings else "")
            if digests is not None:
                digests[claim.id] = measured_digest(m)
        parts.append(text)
        verdicts.append((claim.id, verdict))
    summary = ["| claim | verdict |", "|---|---|", *(f"| {i} | {v} |" for i, v in verdicts)]
    missing = [i for i, v in verdicts if v == NOT_RUN]
    if missing:
        summary += ["", f"Written with `--partial`: {', '.join(missing)} not run yet (each section below gives "
                        "its command); `make reproduce` resumes them and rewrites this page."]
    top = header.strip() + "\n\n" if header.strip() else ""
    atomic_write_bytes(out, (top + "\n".join(summary) + "\n\n" + "\n".join(parts)).encode())
    return verdicts


def describe(root: Path, gpu: str = "") -> str:
    """The report's header: date, machine (``gpu``: the GPU's name, else "no GPU"), and the members' own
    run time summed (resumed runs count their last run) over every step output under ``root``."""
    seconds, n = 0.0, 0
    for man in root.rglob("_manifest.json"):
        try:
            seconds += float(json.loads(man.read_text())["timings"]["seconds_last_run"])
            n += 1
        except (KeyError, ValueError, TypeError, json.JSONDecodeError):
            continue
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return (f"Written by `cptkit reproduce-report` (the last step of `make reproduce`) on "
            f"{time.strftime('%Y-%m-%d')}, on {os.cpu_count()} CPU cores ({cpu}), {gpu or 'no GPU'}, from the {n} step outputs "
            f"under `{root}` (corpus slice, base model, streams, members, evaluations), which took "
            f"{seconds / 60:.1f} minutes of their own run time in all.")


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit reproduce-report", description=__doc__.splitlines()[0])
    p.add_argument("claims", type=Path, help="the claims YAML")
    p.add_argument("--out", type=Path, required=True, help="the markdown report to write")
    p.add_argument("--root", type=Path, default=None, help="where member globs start (default: the YAML's folder)")
    p.add_argument("--header", default=None,
                   help="text above the claims (default: date, machine and the run time of the outputs under --root)")
    p.add_argument("--partial", action="store_true", help="report a claim whose sweep is unfinished as not run")
    p.add_argument("--preamble", type=Path, default=None, help="markdown placed under the header (the set-up)")
    p.add_argument("--outputs", type=Path, default=None,
                   help="the folder whose step outputs the default header counts (default: --root)")
    p.add_argument("--readings", type=Path, default=None,
                   help="YAML: claim id -> {measured: DIGEST, text}, the prose under each verdict (written after the run)")
    p.add_argument("--gpu", default="", metavar="NAME",
                   help="the members were made on this GPU: claims not testable only for want of one are decided")
    a = p.parse_args(argv)
    root = a.root or a.claims.parent
    header = describe(a.outputs or root, a.gpu) if a.header is None else a.header
    if a.preamble is not None:
        header = a.preamble.read_text(encoding="utf-8").strip() + "\n\n" + header
    digests: dict[str, str] = {}
    verdicts = report(a.claims, a.out, root, header, a.partial, gpu=bool(a.gpu), readings=a.readings, digests=digests,
                       machine=machine_text(a.gpu))
    for cid, v in verdicts:
        print(f"{cid}: {v}" + (f" (measured {digests[cid]})" if cid in digests else ""))
    return 0
