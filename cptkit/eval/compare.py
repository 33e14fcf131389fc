"""Put several ``evaluate`` outputs side by side (the papers' Table 1 layout), with deltas.

Rows are runs (the first is the baseline), columns are benchmarks (``acc_norm`` for
multiple choice, ``exact_match`` for generative, in %) and then perplexity per group; a
``Δ`` row under each later run gives its difference from the baseline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cptkit.errors import CptkitError

RESULTS = "_results.json"


def load_results(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    f = p / RESULTS if p.is_dir() else p
    if not f.is_file():
        raise CptkitError(f"{path}: no {RESULTS} (is it the --out of cptkit evaluate?)")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CptkitError(f"{f}: malformed JSON: {e.msg} (line {e.lineno})") from None


def headline(metrics: dict[str, Any]) -> tuple[str, float]:
    key = "acc_norm" if "acc_norm" in metrics else "exact_match" if "exact_match" in metrics else "acc"
    return key, float(metrics[key])


def compare_table(runs: dict[str, dict[str, Any]], metric: str | None = None) -> tuple[list[str], list[list[Any]]]:
    """``(header, rows)``: one row per run (+ a Δ row vs the first run), columns benchmarks then ppl groups.

    Benchmark values are in %; perplexity columns are ``ppl:<group>``. Missing values are None.
    """
    if not runs:
        raise CptkitError("nothing to compare: pass two or more evaluate outputs")
    tasks: list[str] = []
    groups: list[str] = []
    for r in runs.values():
        for t in (r.get("tasks") or {}):
            if t not in tasks:
                tasks.append(t)
        ppl = r.get("perplexity") or {}
        for g in list(ppl.get("groups") or {}) + (["all"] if ppl else []):
            if g not in groups:
                groups.append(g)

    def values(r: dict) -> list[float | None]:
        out: list[float | None] = []
        for t in tasks:
            m = (r.get("tasks") or {}).get(t, {}).get("metrics")
            if m is None:
                out.append(None)
            else:
                out.append(100 * float(m[metric]) if metric and metric in m else 100 * headline(m)[1])
        ppl = r.get("perplexity") or {}
        for g in groups:
            v = ppl.get("all") if g == "all" and "all" not in (ppl.get("groups") or {}) else (ppl.get("groups") or {}).get(g)
            out.append(float(v["ppl"]) if v else None)
        return out

    header = ["run"] + tasks + [f"ppl:{g}" for g in groups] + (["avg"] if tasks else [])
    rows: list[list[Any]] = []
    base: list[float | None] | None = None
    for name, r in runs.items():
        vals = values(r)
        bench = [v for v in vals[:len(tasks)] if v is not None]
        avg = sum(bench) / len(bench) if bench and len(bench) == len(tasks) else None
        full = vals + ([avg] if tasks else [])
        rows.append([name] + full)
        if base is None:
            base = full
        else:
            rows.append(["  Δ vs " + next(iter(runs))] + [
                (v - b) if v is not None and b is not None else None for v, b in zip(full, base, strict=True)])
    return header, rows


def to_markdown(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        delta = str(r[0]).lstrip().startswith("Δ")
        cells = [str(r[0])] + [("–" if v is None else f"{v:+.2f}") if delta else fmt(v) for v in r[1:]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def print_compare(header: list[str], rows: list[list[Any]]) -> None:
    """A rich table on stderr; deltas green when better (higher score, lower perplexity)."""
    from rich.table import Table

    from cptkit.progress import console

    t = Table(title="evaluate-compare", header_style="bold")
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        delta = str(r[0]).lstrip().startswith("Δ")
        cells = [str(r[0])]
        for h, v in zip(header[1:], r[1:], strict=True):
            if v is None:
                cells.append("–")
            elif delta:
                good = (v < 0) if h.startswith("ppl:") else (v > 0)
                cells.append(f"[{'green' if good else 'red' if v != 0 else 'white'}]{v:+.2f}[/]")
            else:
                cells.append(f"{v:.2f}")
        t.add_row(*cells, style="dim" if delta else None)
    console.print(t)
