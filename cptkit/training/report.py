"""The CPT result table: domain gain against forgetting, for a base model and its CPT arms.

``python -m cptkit.training.report base=eval/base noreplay=eval/noreplay replay20=eval/replay``
reads ``cptkit evaluate`` outputs (the first is the base model) and prints one markdown table:
per model the domain perplexity (the gain), the general perplexity (the forgetting) and one
task score, then a one-line reading computed from those numbers (:func:`reading`). Gains and
forgetting are measured in log-perplexity (nats per token), so "reaches 90% of the no-replay
domain gain" means 90% of the no-replay arm's drop in domain loss.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError


def arm_numbers(results: dict[str, Any], domain: str, general: str, task: str | None) -> dict[str, float | None]:
    """``{domain_loss, general_loss, task}`` of one evaluate output (task score in %, None when absent)."""
    groups = ((results.get("perplexity") or {}).get("groups")) or {}
    for g in (domain, general):
        if g not in groups:
            raise CptkitError(f"evaluate output has no perplexity group {g!r} (groups: {', '.join(groups) or 'none'}); "
                              "evaluate with eval.ppl.group_by=domain on the stream's _eval.jsonl.gz")
    score = None
    if task:
        m = ((results.get("tasks") or {}).get(task) or {}).get("metrics")
        if m is None:
            raise CptkitError(f"evaluate output has no task {task!r}")
        score = 100 * float(m.get("acc_norm", m.get("exact_match", m.get("acc"))))
    return {"domain_loss": float(groups[domain]["loss"]), "general_loss": float(groups[general]["loss"]),
            "task": score}


def cpt_table(arms: dict[str, dict[str, float | None]], task: str | None) -> str:
    """Markdown: one row per model; PPLs, the task score, and each arm's change against the first row."""
    names = list(arms)
    base = arms[names[0]]
    head = ["model", "domain PPL", "general PPL", f"{task} (%)" if task else None, "domain gain", "general PPL vs base"]
    head = [h for h in head if h]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    g0 = base["domain_loss"]
    for n in names:
        a = arms[n]
        cells = [n, f"{math.exp(a['domain_loss']):.1f}", f"{math.exp(a['general_loss']):.1f}"]
        if task:
            cells.append("–" if a["task"] is None else f"{a['task']:.1f}")
        if n == names[0]:
            cells += ["–", "–"]
        else:
            cells += [f"{g0 - a['domain_loss']:+.3f} nats",
                      f"{100 * (math.exp(a['general_loss'] - base['general_loss']) - 1):+.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reading(arms: dict[str, dict[str, float | None]], no_replay: str, replay: str) -> str:
    """One sentence on what the numbers show: the replay arm's forgetting and share of the no-replay gain.

    ``arms`` holds the base first. Honest in every direction: it says when the domain was not
    learnt, when the base did not forget, and when replay did not help.
    """
    base = arms[next(iter(arms))]
    nr, rp = arms[no_replay], arms[replay]

    def gen(a):
        return 100 * (math.exp(a["general_loss"] - base["general_loss"]) - 1)

    gain_nr = base["domain_loss"] - nr["domain_loss"]
    gain_rp = base["domain_loss"] - rp["domain_loss"]
    dom_nr = 100 * (1 - math.exp(-gain_nr))
    if gain_nr <= 0:
        return (f"{no_replay} did not lower the domain perplexity (domain PPL {100 * (math.exp(-gain_nr) - 1):+.1f}% "
                "vs the base): this run shows no domain gain to trade against forgetting.")
    share = 100 * gain_rp / gain_nr
    f_nr, f_rp = gen(nr), gen(rp)
    if f_nr <= 0:
        return (f"{no_replay} lowered domain PPL by {dom_nr:.0f}% without raising general PPL ({f_nr:+.1f}%): "
                f"no forgetting to prevent in this run; {replay} reached {share:.0f}% of that domain gain.")
    if f_rp <= 0:
        return (f"{replay} lowers general PPL {-f_rp:.1f}% below the base (no forgetting; no replay: {f_nr:+.1f}%) "
                f"while reaching {share:.0f}% of the no-replay domain gain (no replay lowers domain PPL by "
                f"{dom_nr:.0f}%).")
    if f_rp < f_nr:
        kept = 100 * (1 - f_rp / f_nr)
        return (f"{replay} keeps general PPL within {f_rp:+.1f}% of the base (no replay: {f_nr:+.1f}%, "
                f"{kept:.0f}% of the forgetting avoided) while reaching {share:.0f}% of the no-replay domain gain "
                f"(no replay lowers domain PPL by {dom_nr:.0f}%).")
    return (f"{replay} did not reduce forgetting in this run: general PPL {f_rp:+.1f}% vs {f_nr:+.1f}% without "
            f"replay, at {share:.0f}% of the no-replay domain gain.")


def seed_numbers(results: dict[str, Any], groups: list[str], task: str | None) -> dict[str, float | None]:
    """``{group: loss, ..., "task": score}`` of one evaluate output (one seed of one model)."""
    ppl = ((results.get("perplexity") or {}).get("groups")) or {}
    missing = [g for g in groups if g not in ppl]
    if missing:
        raise CptkitError(f"evaluate output has no perplexity group {missing[0]!r} (groups: {', '.join(ppl) or 'none'})")
    out: dict[str, float | None] = {g: float(ppl[g]["loss"]) for g in groups}
    out["task"] = arm_numbers(results, groups[0], groups[0], task)["task"] if task else None
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
    return ("; ".join(parts) + f". {replay} − {no_replay} on general text: {diff.text()} nats "
            f"(less forgetting: {verdict}); on the domain: {cost.text()} nats. A difference holds only where "
            "mean ± 2 SE over seeds excludes zero.")


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
        if all(len(v) == 1 for v in named.values()):
            arms = {n: arm_numbers(v[0], a.domain, a.general, task) for n, v in named.items()}
            text = cpt_table(arms, task) + "\n" + reading(arms, no_replay, replay) + "\n"
        else:
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
