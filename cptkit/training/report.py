"""The CPT result table: domain gain against forgetting, for a base model and its CPT arms.

``python -m cptkit.training.report base=eval/b_s0,eval/b_s1 noreplay=... replay20=... --lang zh``
reads ``cptkit evaluate`` outputs (the base first; one directory per seed, comma-separated) and
prints one markdown table: the base's held-out losses, then each arm's change against the base
of the same seed, as mean ± standard error over seeds, every loss column in nats per token and
the task in accuracy points (:func:`seeded_table`); then a reading that calls a difference
real only where it exceeds twice its standard error (:func:`seeded_reading`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError


def seed_numbers(results: dict[str, Any], groups: list[str], task: str | None) -> dict[str, float | None]:
    """``{group: loss, ..., "task": score}`` of one evaluate output (one seed of one model)."""
    ppl = ((results.get("perplexity") or {}).get("groups")) or {}
    missing = [g for g in groups if g not in ppl]
    if missing:
        raise CptkitError(f"evaluate output has no perplexity group {missing[0]!r} (groups: {', '.join(ppl) or 'none'}); "
                          "evaluate with eval.ppl.group_by=domain on the stream's _eval.jsonl.gz")
    out: dict[str, float | None] = {g: float(ppl[g]["loss"]) for g in groups}
    out["task"] = None
    if task:
        m = ((results.get("tasks") or {}).get(task) or {}).get("metrics")
        if m is None:
            raise CptkitError(f"evaluate output has no task {task!r}")
        out["task"] = 100 * float(m.get("acc_norm", m.get("exact_match", m.get("acc"))))
    return out


def seeded_table(runs: dict[str, list[dict[str, float | None]]], groups: dict[str, str], task: str | None) -> str:
    """Markdown: the base's held-out losses, then each arm's change against the base *on the same
    seed* (paired), as mean ± standard error over seeds. Every loss column is in nats per token."""
    from cptkit.eval.stats import mean_se

    names = list(runs)
    base = runs[names[0]]
    head = ["model", "seeds", *[f"{label} (nats/token)" for label in groups.values()]]
    if task:
        head.append(f"{task} (points)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(xs: list[float], sign: bool) -> str:
        m, se = mean_se(xs)
        err = "" if math.isnan(se) else f" ± {se:.3f}"
        return (f"{m:+.3f}" if sign else f"{m:.3f}") + err

    for n in names:
        seeds = runs[n]
        if len(seeds) != len(base):
            raise CptkitError(f"{n}: {len(seeds)} seeds, the base has {len(base)}: pair every arm seed with a base seed")
        paired = n != names[0]
        row = [n if not paired else f"{n} − base", str(len(seeds))]
        for g in groups:
            xs = [s[g] - b[g] if paired else s[g] for s, b in zip(seeds, base, strict=True)]
            row.append(cell(xs, paired))
        if task:
            xs = [(s["task"] - b["task"]) if paired else s["task"] for s, b in zip(seeds, base, strict=True)]
            row.append(cell(xs, paired) if None not in xs else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def seeded_reading(runs: dict[str, list[dict[str, float | None]]], domain: str, general: str,
                   no_replay: str, replay: str) -> str:
    """What holds: each arm's domain gain and forgetting, and replay against no replay, each a paired
    effect over seeds that holds only where mean ± 2 SE excludes zero (:func:`cptkit.eval.stats.effect`)."""
    from cptkit.eval.stats import CONTRADICTS, HOLDS, effect

    FORGETTING = {HOLDS: "forgetting", CONTRADICTS: "no forgetting: the general loss fell"}
    base = runs[next(iter(runs))]
    parts = []
    for n in (no_replay, replay):
        gain = effect([s[domain] - b[domain] for s, b in zip(runs[n], base, strict=True)], expect=-1)
        forg = effect([s[general] - b[general] for s, b in zip(runs[n], base, strict=True)], expect=+1)
        parts.append(f"{n}: domain {gain.text()} nats ({'a gain' if gain.verdict == HOLDS else gain.verdict}), "
                     f"general {forg.text()} ({FORGETTING.get(forg.verdict, forg.verdict)})")
    diff = effect([r[general] - nr[general] for r, nr in zip(runs[replay], runs[no_replay], strict=True)], expect=-1)
    cost = effect([r[domain] - nr[domain] for r, nr in zip(runs[replay], runs[no_replay], strict=True)], expect=+1)
    verdict = {"holds": "holds", "contradicts": "the opposite holds"}.get(diff.verdict, diff.verdict)
    why = ("One seed has no standard error, so no difference can hold yet: run three seeds "
           "(make cpt-experiment)." if len(base) == 1 else
           "A difference holds only where mean ± 2 SE over seeds excludes zero.")
    return ("; ".join(parts) + f". {replay} − {no_replay} on general text: {diff.text()} nats "
            f"(less forgetting: {verdict}); on the domain: {cost.text()} nats. {why}")


def main(argv: list[str] | None = None) -> int:
    from cptkit.eval.compare import load_results

    p = argparse.ArgumentParser(prog="python -m cptkit.training.report", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="NAME=EVALDIR or NAME=DIR1,DIR2,... (one per seed), the base first")
    p.add_argument("--domain", default="domain", help="perplexity group of the new domain")
    p.add_argument("--general", default="general", help="perplexity group of the general (old) data")
    p.add_argument("--lang", default=None, help="perplexity group of the new language (seeded table)")
    p.add_argument("--task", default=None, help="task whose score is shown (default: the first one)")
    p.add_argument("--no-replay", default=None, help="the no-replay arm (default: the second run)")
    p.add_argument("--replay", default=None, help="the replay arm for the reading (default: the third run)")
    p.add_argument("--out", default=None, help="also write the table and reading here (markdown)")
    p.add_argument("--curves", default=None, help="PNG overlaying the arms' eval-loss curves")
    a = p.parse_args(argv)
    try:
        named = {}
        for r in a.runs:
            name, sep, paths = r.partition("=")
            if not sep:
                raise CptkitError(f"{r}: write NAME=EVALDIR (or NAME=DIR1,DIR2,... one per seed)")
            named[name] = [load_results(x) for x in paths.split(",") if x]
        if len(named) < 3:
            raise CptkitError("give the base and at least two arms (no replay, replay)")
        names = list(named)
        first = named[names[0]][0]
        task = a.task or next(iter(first.get("tasks") or {}), None)
        no_replay, replay = a.no_replay or names[1], a.replay or names[2]
        groups = {a.domain: "domain Δ", **({a.lang: "language Δ"} if a.lang else {}),
                  a.general: "general Δ (forgetting)"}
        runs = {n: [seed_numbers(r, list(groups), task) for r in v] for n, v in named.items()}
        text = (seeded_table(runs, groups, task) + "\n"
                + seeded_reading(runs, a.domain, a.general, no_replay, replay) + "\n")
        if a.curves:
            from cptkit.training.metrics import overlay_curves, run_dir_of

            dirs = {n: ds for n in names[1:]  # the arms: every seed's run, drawn as mean ± SE
                    if (ds := [d for r in named[n] if (d := run_dir_of(r)) is not None])}
            note = overlay_curves(dirs, Path(a.curves)) if dirs else "no run with eval curves"
            if note:
                print(note, file=sys.stderr)
    except CptkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.out:
        from cptkit.core.shards import atomic_write_bytes

        atomic_write_bytes(Path(a.out), text.encode())
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
