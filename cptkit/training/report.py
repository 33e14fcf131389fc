"""The CPT result table: every arm against the re-adapted base B0, and the pre-registered claims.

``cptkit cpt-report b0=eval/b0_s0,eval/b0_s1 noreplay=... replay=... --claims
conf/cpt/claims.yaml [--shipped eval/shipped]`` reads ``cptkit evaluate`` outputs (one directory per
seed, comma-separated; B0 first) and prints one markdown table: the shipped model's and B0's
held-out losses, then each arm's change against B0 *of the same seed*, as mean ± standard error over
seeds with the per-document error beside it (:func:`seeded_table`); then each claim of the claims
file decided by :mod:`cptkit.eval.stats` (paired t at n − 1 df, Holm over the family, a minimum
effect, TOST for "no effect"), one sentence per claim naming its test (:func:`claims_reading`).

The v3 claims file (conf/cpt/claims_v3.yaml) adds: Holm within each claim's ``family``; a claim's
``control`` (read only if that claim holds); the columns (``groups``, ``labels``: held-out base text,
drift from B0); the domain gain against ``gain_vs`` (the neutral arm) as a last column; ``--scale``
in every verdict; and ``--pareto``, domain gain against forgetting (:func:`pareto_points`,
:func:`cptkit.training.plots.pareto_plot`). A v1 file (conf/cpt/claims.yaml) renders as before.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.shards import atomic_write_bytes
from cptkit.eval.compare import load_results
from cptkit.eval.stats import HOLDS, NOT_TESTABLE, Comparison, Effect, decide, doc_se, mean_se, tost
from cptkit.training.metrics import run_dir_of
from cptkit.training.plots import overlay_curves, pareto_plot

Seed = dict[str, Any]  # {group: loss, "task": points | None, "docs": {group: [per-document loss]}}
DEFAULT_GROUPS = ["domain", "zh", "general", "outside", "probe"]  # the v1 design's columns


def seed_numbers(results: dict[str, Any], groups: list[str], task: str | None) -> Seed:
    """``{group: loss, ..., "task": score, "docs": {group: [loss per document]}}`` of one evaluate
    output (one seed of one model)."""
    ppl = ((results.get("perplexity") or {}).get("groups")) or {}
    missing = [g for g in groups if g not in ppl]
    if missing:
        raise CptkitError(f"evaluate output has no perplexity group {missing[0]!r} (groups: {', '.join(ppl) or 'none'}); "
                          "evaluate with eval.ppl.group_by=domain on the stream's _eval.jsonl.gz")
    out: Seed = {g: float(ppl[g]["loss"]) for g in groups}
    out["docs"] = {g: [s / n for s, n in ppl[g].get("doc_nll", []) if n] for g in groups}
    out["task"] = None
    if task:
        m = ((results.get("tasks") or {}).get(task) or {}).get("metrics")
        if m is None:
            raise CptkitError(f"evaluate output has no task {task!r}")
        out["task"] = 100 * float(m.get("acc_norm", m.get("exact_match", m.get("acc"))))
    return out


def paired(arm: list[Seed], base: list[Seed], metric: str) -> tuple[list[float], list[list[float]]]:
    """Per-seed differences ``arm − base`` of ``metric``, and per seed the per-document differences
    (empty where the two were not scored on the same documents)."""
    seeds = [a[metric] - b[metric] for a, b in zip(arm, base, strict=True)]
    docs = []
    for a, b in zip(arm, base, strict=True):
        da, db = a["docs"].get(metric, []), b["docs"].get(metric, [])
        docs.append([x - y for x, y in zip(da, db, strict=True)] if da and len(da) == len(db) else [])
    return seeds, docs


def _cell(xs: list[float], sign: bool, docs: list[list[float]] | None = None) -> str:
    m, se = mean_se(xs)
    text = f"{m:+.3f}" if sign else f"{m:.3f}"
    if not math.isnan(se):
        text += f" ± {se:.3f}"
    if docs and all(docs) and not math.isnan(dse := doc_se(docs)):
        text += f" (docs ± {dse:.3f})"
    return text


def seeded_table(runs: dict[str, list[Seed]], groups: dict[str, str], task: str | None,
                 shipped: list[Seed] | None = None, shipped_label: str = "shipped model",
                 gain_vs: str | None = None) -> str:
    """Markdown: the shipped model and B0 (the first run) as absolute losses, then each arm's change
    against B0 *on the same seed*: mean ± SE over seeds (docs ± the per-document error). With
    ``gain_vs`` (the neutral arm), a last column: each arm's domain gain, arm − ``gain_vs`` on the
    domain, paired by seed (the share of the fall that any text of the pool's format gives removed)."""
    names = list(runs)
    base = runs[names[0]]
    if gain_vs is not None and (gain_vs not in runs or "domain" not in groups):
        raise CptkitError(f"domain gain against {gain_vs!r} needs that run and the domain group "
                          f"(runs: {', '.join(runs)}; groups: {', '.join(groups)})")
    head = ["model", "seeds", *[f"{label} (nats/token)" for label in groups.values()]]
    if task:
        head.append(f"{task} (points)")
    if gain_vs is not None:
        head.append(f"domain gain, arm − {gain_vs} (nats/token)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = ([(f"{shipped_label} (not the baseline)", shipped, False)] if shipped else []) + \
        [(n if n == names[0] else f"{n} − {names[0]}", runs[n], n != names[0]) for n in names]
    for label, seeds, is_delta in rows:
        if len(seeds) != len(base) and is_delta:
            raise CptkitError(f"{label}: {len(seeds)} seeds, {names[0]} has {len(base)}: pair every arm seed with a base seed")
        row = [label, str(len(seeds))]
        for g in groups:
            if is_delta:
                xs, docs = paired(seeds, base, g)
                row.append(_cell(xs, True, docs))
            else:
                row.append(_cell([s[g] for s in seeds], False))
        if task:
            vals = [s["task"] for s in seeds]
            if None in vals:
                row.append("–")
            elif is_delta:
                row.append(_cell([v - b["task"] for v, b in zip(vals, base, strict=True)], True))
            else:
                row.append(_cell(vals, False))
        if gain_vs is not None:
            name = label.split(" − ")[0]
            if not is_delta or name == gain_vs or name not in runs:
                row.append("–")
            else:
                xs, docs = paired(seeds, runs[gain_vs], "domain")
                row.append(_cell(xs, True, docs))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def load_claims(path: Path) -> dict[str, Any]:
    """The pre-registered claims file (conf/cpt/claims.yaml), checked."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CptkitError(f"{path}: cannot read the claims: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list) or not doc["claims"]:
        raise CptkitError(f"{path}: expected a mapping with a non-empty list 'claims'")
    for c in doc["claims"]:
        if not isinstance(c, dict) or not {"id", "text", "compare"} <= set(c):
            raise CptkitError(f"{path}: every claim needs id, text and compare (got {c!r})")
        try:
            c["comparison"] = Comparison(**c["compare"])
        except (TypeError, ValueError) as e:
            raise CptkitError(f"{path}: claim {c['id']}: {e}") from None
    ids = [c["id"] for c in doc["claims"]]
    for c in doc["claims"]:
        if ids.count(c["id"]) > 1:
            raise CptkitError(f"{path}: claim id {c['id']!r} occurs twice")
        if c.get("control") is not None and c["control"] not in ids:
            raise CptkitError(f"{path}: claim {c['id']}: its control {c['control']!r} is not a claim ({', '.join(ids)})")
    return doc


def families(claims: dict[str, Any]) -> dict[str, list[int]]:
    """The Holm families: claim indices by ``family`` (one family, ``""``, for a file without them)."""
    out: dict[str, list[int]] = {}
    for i, c in enumerate(claims["claims"]):
        out.setdefault(str(c.get("family") or ""), []).append(i)
    return out


def _values(runs: dict[str, list[Seed]], c: Comparison, where: str) -> tuple[list[float], list[list[float]]]:
    for arm in (c.a, c.b):
        if arm not in runs:
            raise CptkitError(f"{where}: compares {arm!r}, which is not among the runs ({', '.join(runs)})")
    if c.metric == "task":
        if any(s["task"] is None for arm in (c.a, c.b) for s in runs[arm]):
            raise CptkitError(f"{where}: compares the task, which was not evaluated (give --task and evaluate it)")
        return [a["task"] - b["task"] for a, b in zip(runs[c.a], runs[c.b], strict=True)], []
    return paired(runs[c.a], runs[c.b], c.metric)


def decide_claims(runs: dict[str, list[Seed]], claims: dict[str, Any]) -> list[tuple[dict, Effect, Effect | None]]:
    """Each claim's primary comparison decided over its family (Holm within each ``family``; the whole
    file when no claim names one), with the per-document error, and for a directional claim that does
    not hold and names an ``equivalence_margin``, its TOST."""
    alpha = float(claims.get("alpha", 0.05))
    family, docs = [], []
    for c in claims["claims"]:
        seeds, per_doc = _values(runs, c["comparison"], f"claim {c['id']}")
        family.append((c["comparison"], seeds))
        docs.append(per_doc)
    decided: list[Effect | None] = [None] * len(family)
    for name, idx in families(claims).items():
        for i, e in zip(idx, decide([family[i] for i in idx], alpha), strict=True):
            decided[i] = replace(e, test=f"{e.test}, family {name}") if name and e.verdict != NOT_TESTABLE else e
    out = []
    for c, (_, seeds), per_doc, e in zip(claims["claims"], family, docs, decided, strict=True):
        assert e is not None
        if per_doc and all(per_doc):
            e = replace(e, doc_se=doc_se(per_doc))
        margin = c.get("equivalence_margin")
        second = tost(seeds, float(margin), alpha) if margin and e.verdict not in (HOLDS, NOT_TESTABLE) else None
        out.append((c, e, second))
    return out


def claims_reading(runs: dict[str, list[Seed]], claims: dict[str, Any], source: str, scale: str | None = None) -> str:
    """One line per claim: what it says, its comparison, and the verdict sentence naming its test, its
    Holm family and (``scale``: the model, the tokens per arm, the machine) the scale it was decided at."""
    decided = decide_claims(runs, claims)
    fams = families(claims)
    if list(fams) == [""]:
        over = f"with Holm's correction over the {len(decided)}"
    else:
        over = "with Holm's correction within each family (" + ", ".join(
            f"{name}: {len(idx)}" for name, idx in fams.items()) + ")"
    lines = [f"Claims, each with its one primary comparison fixed before the runs in `{source}`, "
             f"decided at α = {claims.get('alpha', 0.05)} {over}:", ""]
    verdicts = {c["id"]: e.verdict for c, e, _ in decided}
    for c, e, second in decided:
        cmp_: Comparison = c["comparison"]
        what = f"{cmp_.a} − {cmp_.b} on {cmp_.metric}"
        kind = (f"expected {'+' if cmp_.expect > 0 else '−'}, minimum effect {cmp_.min_effect:g}"
                if cmp_.kind == "effect" else f"equivalence within ±{cmp_.margin:g}")
        at = f" At {scale}." if scale else ""
        lines.append(f"- **{c['id']}**: {c['text']}. {what} ({kind}): {e.sentence()}.{at}")
        if c.get("control") and verdicts[c["control"]] != HOLDS:
            lines.append(f"  - Its control, {c['control']}, does not hold (its verdict: {verdicts[c['control']]}): "
                         f"this measure's change is not read as {c['id']}.")
        if second is not None:
            lines.append(f"  - Not shown to hold; as a \"no effect\" question (secondary, not Holm-adjusted): "
                         f"{second.sentence()}.")
    n = len(next(iter(runs.values())))
    if n < 2:
        lines += ["", "One seed: an illustration, not evidence. Every comparison is *not testable* without an "
                      "error bar; `make cpt-experiment` runs five seeds."]
    return "\n".join(lines) + "\n"


def merge_results(parts: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One model's evaluate outputs over disjoint documents and tasks, as one: B0 is scored once on
    what no seed changes (the probe, the outside text, the task) and per seed on its held-out sample."""
    out = dict(parts[0])
    ppl = dict(((out.get("perplexity") or {}).get("groups")) or {})
    tasks = dict(out.get("tasks") or {})
    for part, name in zip(parts[1:], names[1:], strict=True):
        for kind, have, new in (("perplexity group", ppl, ((part.get("perplexity") or {}).get("groups")) or {}),
                                ("task", tasks, part.get("tasks") or {})):
            twice = sorted(set(have) & set(new))
            if twice:
                raise CptkitError(f"{name}: {kind} {twice[0]!r} is also in {names[0]} (each part must score other documents)")
            have.update(new)
    out["perplexity"] = dict(out.get("perplexity") or {}, groups=ppl)
    out["tasks"] = tasks
    return out


def _load_named(specs: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``NAME=DIR[+DIR...][,DIR[+DIR...]...]``: one entry per seed, each the merge of its parts."""
    named = {}
    for r in specs:
        name, sep, paths = r.partition("=")
        if not sep:
            raise CptkitError(f"{r}: write NAME=EVALDIR (or NAME=DIR1,DIR2,... one per seed; DIR+DIR merges parts)")
        named[name] = [merge_results([load_results(y) for y in x.split("+")], x.split("+"))
                       for x in paths.split(",") if x]
    return named


def _curves(named: dict[str, list[dict[str, Any]]], out: str) -> None:
    dirs = {n: ds for n in list(named)[1:]  # the arms: every seed's run, drawn as mean ± SE
            if (ds := [d for r in named[n] if (d := run_dir_of(r)) is not None])}
    note = overlay_curves(dirs, Path(out)) if dirs else "no run with eval curves"
    if note:
        print(note, file=sys.stderr)


def contamination_line(out: Path, task: str) -> str:
    """One sentence: how many of the task's test items ``evaluate-contamination`` found in the text it read."""
    from cptkit.eval.contamination import REPORT  # deferred: numpy

    try:
        rep = json.loads((out / REPORT).read_text())["benchmarks"][task]
    except (OSError, ValueError, KeyError, TypeError):
        raise CptkitError(f"{out / REPORT}: no contamination report for {task!r} (run evaluate-contamination "
                          f"eval.tasks=[{task}] on the training text)") from None
    return (f"\n{task} against the training text (`cptkit evaluate-contamination`, {out}): "
            f"{rep['test_items_hit']} of {rep['test_items']} test items found.\n")


def pareto_points(runs: dict[str, list[Seed]], spec: dict[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """Per run of the Pareto spec (``arms`` and ``sweep``): domain gain (``gain.metric``, run −
    ``gain.vs``) and forgetting (``forgetting.metric``, run − ``forgetting.vs``), each its paired
    per-seed differences' mean and SE: ``(gain, gain SE, forgetting, forgetting SE)``. A run against
    itself is 0 ± 0."""
    try:
        gm, gv = spec["gain"]["metric"], spec["gain"]["vs"]
        fm, fv = spec["forgetting"]["metric"], spec["forgetting"]["vs"]
    except (KeyError, TypeError):
        raise CptkitError("pareto needs gain: {metric, vs} and forgetting: {metric, vs}") from None
    out = {}
    for name in [*spec.get("arms", []), *[n for n in spec.get("sweep", []) if n not in spec.get("arms", [])]]:
        for r in (name, gv, fv):
            if r not in runs:
                raise CptkitError(f"pareto: {r!r} is not among the runs ({', '.join(runs)})")
        g = mean_se(paired(runs[name], runs[gv], gm)[0])
        f = mean_se(paired(runs[name], runs[fv], fm)[0])
        out[name] = (g[0], 0.0 if name == gv else g[1], f[0], 0.0 if name == fv else f[1])
    return out


def _pareto(runs: dict[str, list[Seed]], claims: dict[str, Any], out: Path, scale: str | None) -> None:

    spec = claims.get("pareto")
    if not spec:
        print(f"no Pareto plot: the claims file has no pareto section ({out} not written)", file=sys.stderr)
        return
    pts = pareto_points(runs, spec)
    n = len(next(iter(runs.values())))
    note = pareto_plot(pts, list(spec.get("sweep", [])), out,
                       f"domain gain: arm − {spec['gain']['vs']} on {spec['gain']['metric']} (nats/token; left: more gain)",
                       f"forgetting: arm − {spec['forgetting']['vs']} on {spec['forgetting']['metric']} (nats/token)",
                       f"mean ± SE over {n} seeds" + (f"; {scale}" if scale else ""))
    if note:
        print(note, file=sys.stderr)


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit cpt-report", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="NAME=EVALDIR or NAME=DIR1,DIR2,... (one per seed; DIR+DIR: parts of one evaluation), B0 first")
    p.add_argument("--claims", default="conf/cpt/claims.yaml", help="the pre-registered claims")
    p.add_argument("--groups", default=None,
                   help="perplexity groups, in column order (default: the claims file's, else domain,zh,general,outside,probe)")
    p.add_argument("--task", default=None, help="task whose score is shown (default: the claims file's; '' none)")
    p.add_argument("--shipped", default=None, help="the shipped model's evaluate output(s): its own row")
    p.add_argument("--shipped-label", default="shipped SmolLM2-135M-Instruct, Q4_1 dequantized")
    p.add_argument("--out", default=None, help="also write the table and reading here (markdown)")
    p.add_argument("--curves", default=None, help="PNG overlaying the arms' eval-loss curves")
    p.add_argument("--pareto", default=None, help="PNG: domain gain against forgetting (the claims file's pareto)")
    p.add_argument("--contamination", default=None,
                   help="an evaluate-contamination output of the training text: the task's items found in it")
    p.add_argument("--scale", default=None, help="the scale every verdict states: model, tokens per arm, machine")
    a = p.parse_args(argv)
    claims = load_claims(Path(a.claims))
    named = _load_named(a.runs)
    if len(named) < 2:
        raise CptkitError("give B0 and at least one arm")
    task = (claims.get("task") if a.task is None else a.task) or None
    names = a.groups.split(",") if a.groups is not None else claims.get("groups") or DEFAULT_GROUPS
    labels = claims.get("labels") or {}
    groups = {g: labels.get(g, f"{g} Δ") for g in names if g}
    runs = {n: [seed_numbers(r, list(groups), task) for r in v] for n, v in named.items()}
    shipped = [seed_numbers(r, list(groups), task) for r in _load_named([f"s={a.shipped}"])["s"]] if a.shipped else None
    gain_vs = claims.get("gain_vs")
    text = (seeded_table(runs, groups, task, shipped, a.shipped_label, gain_vs) + "\n"
            + claims_reading(runs, claims, a.claims, a.scale))
    if a.contamination and task:
        text += contamination_line(Path(a.contamination), task)
    if a.curves:
        _curves(named, a.curves)
    if a.pareto:
        _pareto(runs, claims, Path(a.pareto), a.scale)
    if a.out:
        atomic_write_bytes(Path(a.out), text.encode())
    sys.stdout.write(text)
    return 0
