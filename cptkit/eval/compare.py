"""Put several ``evaluate`` outputs side by side (the papers' Table 1 layout), with deltas.

Rows are runs (the first is the baseline), columns are benchmarks (``acc_norm`` for
multiple choice, ``exact_match`` for generative, in %) and then perplexity per group; a
``Δ`` row under each later run gives its difference from the baseline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError

RESULTS = "_results.json"


def load_results(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    f = p / RESULTS if p.is_dir() else p
    if not f.is_file():
        raise CptkitError(f"{path}: no {RESULTS} (is it the --out of cptkit evaluate?)")
    try:
        results = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CptkitError(f"{f}: malformed JSON: {e.msg} (line {e.lineno})") from None
    except UnicodeDecodeError:
        raise CptkitError(f"{f}: not UTF-8 text (is it the {RESULTS} of cptkit evaluate?)") from None
    if not isinstance(results, dict):
        raise CptkitError(f"{f}: holds a JSON {type(results).__name__}, not the object of cptkit evaluate's {RESULTS}")
    return results


def read_suite(f: Path) -> dict[str, Any]:
    """The suite file that the compared runs' ``_results.json`` name (``suite.file``), checked to be a
    suite's scorecard: ``tables`` of ``groups`` of ``columns`` (:func:`suite_columns`). Anything else
    (a file that is not one) is one line naming it."""
    import yaml

    where = f"{f} (the suite.file of the runs' {RESULTS})"
    try:
        suite = yaml.safe_load(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CptkitError(f"{where}: not a readable YAML suite ({type(e).__name__})") from None
    why = _not_suite(suite)
    if why:
        raise CptkitError(f"{where}: not an evaluate suite: {why}")
    return suite


def _not_suite(suite: Any) -> str | None:
    """What keeps ``suite`` from being a suite :func:`suite_table` lays out (None: nothing)."""
    if not isinstance(suite, dict) or not isinstance(suite.get("tables"), list) or not suite["tables"]:
        return "needs a list of `tables`"
    for t in suite["tables"]:
        if not isinstance(t, dict) or not isinstance(t.get("groups"), list):
            return "each table needs a list of `groups`"
        for g in t["groups"]:
            if not isinstance(g, dict) or not isinstance(g.get("columns"), list):
                return "each group needs a list of `columns`"
            for c in g["columns"]:
                if not isinstance(c, dict) or not isinstance(c.get("label"), str):
                    return "each column needs a `label`"
                if not (isinstance(c.get("task"), str)
                        or (isinstance(c.get("mean"), list) and all(isinstance(x, str) for x in c["mean"]))
                        or (isinstance(c.get("gauntlet"), list) and all(
                            isinstance(b, dict) and isinstance(b.get("task"), str)
                            and isinstance(b.get("baseline"), (int, float)) and b["baseline"] != 1
                            for b in c["gauntlet"]))):
                    return f"column {c['label']!r} needs a `task`, a `mean` of labels or a `gauntlet`"
    return None


def headline(metrics: dict[str, Any]) -> tuple[str, float | None]:
    """The metric a task is summarised by: acc_norm, else exact_match, pass@1, acc, else the first score."""
    for key in ("acc_norm", "exact_match", "pass@1", "acc"):
        if key in metrics:
            break
    else:
        skip = {"n", "num_fewshot", "seconds"}
        keys = [k for k, v in metrics.items() if k not in skip and not k.endswith("_stderr") and isinstance(v, (int, float))]
        if not keys:
            raise CptkitError(f"no score among the metrics {sorted(metrics)}")
        key = keys[0]
    v = metrics[key]
    return key, None if v is None else float(v)


def _suite_file(results: dict[str, Any]) -> str | None:
    """The suite file a run's results name (``suite.file``), or None."""
    suite = results.get("suite")
    f = suite.get("file") if isinstance(suite, dict) else None
    return f if isinstance(f, str) and f else None


def compare_table(runs: dict[str, dict[str, Any]], metric: str | None = None) -> tuple[list[str], list[list[Any]]]:
    """``(header, rows)``: one row per run (+ a Δ row vs the first run), columns benchmarks then ppl groups.

    Benchmark values are in %; perplexity columns are ``ppl:<group>``. Missing values are None.
    When every run was made with the same ``eval.suite``, the table is that paper's layout
    (:func:`suite_table`).
    """
    if not runs:
        raise CptkitError("nothing to compare: pass two or more evaluate outputs")
    suites = {_suite_file(r) for r in runs.values()}
    if len(suites) == 1 and None not in suites and metric is None:
        f = Path(str(next(iter(suites))))
        if f.is_file():
            return suite_table(read_suite(f), runs)
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
                v = m[metric] if metric and metric in m else headline(m)[1]
                out.append(None if v is None else 100 * float(v))
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

    out = ["| " + " | ".join(h.replace("\n", " / ") for h in header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        delta = str(r[0]).lstrip().startswith("Δ")
        cells = [str(r[0])] + [("–" if v is None else f"{v:+.2f}") if delta else fmt(v) for v in r[1:]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def print_compare(header: list[str], rows: list[list[Any]], title: str = "evaluate-compare") -> None:
    """A rich table on stderr; deltas green when better (higher score, lower perplexity)."""
    from rich.table import Table

    from cptkit.core.progress import console  # deferred: rich

    t = Table(title=title, header_style="bold")
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


# --- paper layouts (conf/eval/suites/*.yaml) ------------------------------------------------------
def _task_value(r: dict, col: dict) -> float | None:
    m = (r.get("tasks") or {}).get(col["task"], {}).get("metrics")
    if m is None:
        return None
    if col.get("metric"):
        v = m.get(col["metric"])
    else:
        v = headline(m)[1]
    return None if v is None else 100 * float(v)


def suite_columns(table: dict, r: dict) -> list[tuple[str, float | None, bool]]:
    """``(header, value %, hidden)`` of every column of one suite table for one run.

    A column is ``{label, task, metric?}`` (a task's score), ``{label, mean: [labels]}`` (the mean of
    earlier columns; None when one is missing), or ``{label, gauntlet: [{task, baseline, metric?}]}``
    (the Gauntlet's rescaled average: mean over its benchmarks of ``(score - baseline) / (1 - baseline)``,
    with score and baseline as fractions; None when one benchmark is missing).
    """
    out: list[tuple[str, float | None, bool]] = []
    by_label: dict[str, float | None] = {}
    for g in table["groups"]:
        for col in g["columns"]:
            if "task" in col:
                v = _task_value(r, col)
            elif "mean" in col:
                vs = [by_label.get(x) for x in col["mean"]]
                v = None if any(x is None for x in vs) or not vs else sum(vs) / len(vs)  # type: ignore[arg-type]
            elif "gauntlet" in col:
                parts = []
                for b in col["gauntlet"]:
                    x = _task_value(r, b)
                    parts.append(None if x is None else (x / 100 - b["baseline"]) / (1 - b["baseline"]) * 100)
                v = None if not parts or any(x is None for x in parts) else sum(parts) / len(parts)  # type: ignore[arg-type]
            else:
                raise CptkitError(f"suite column {col}: needs task, mean or gauntlet")
            by_label[col["label"]] = v
            head = f"{g['name']}\n{col['label']}" if g.get("name") else col["label"]
            out.append((head, v, bool(col.get("hidden"))))
    return out


def suite_table(suite: dict, runs: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """A paper's table: runs as rows (Δ rows vs the first), or benchmarks as rows with ``transpose: true``.

    Several tables of a suite are put side by side (their columns in order).
    """
    cols_per_run = {name: [c for t in suite["tables"] for c in suite_columns(t, r) if not c[2]]
                    for name, r in runs.items()}
    first = next(iter(cols_per_run.values()))
    header = [str(h) for h, _, _ in first]
    if any(t.get("transpose") for t in suite["tables"]):
        names = list(runs)
        rows = [[h.replace("\n", " / ")] + [cols_per_run[n][i][1] for n in names] for i, h in enumerate(header)]
        return ["benchmark"] + names, rows
    rows: list[list[Any]] = []
    base: list[float | None] | None = None
    for name, cols in cols_per_run.items():
        vals = [v for _, v, _ in cols]
        rows.append([name] + vals)
        if base is None:
            base = vals
        else:
            rows.append(["  Δ vs " + next(iter(runs))] + [
                (v - b) if v is not None and b is not None else None for v, b in zip(vals, base, strict=True)])
    return ["run"] + header, rows


def print_suite(suite: dict, runs: dict[str, dict[str, Any]]) -> None:
    """The suite's paper layout as rich tables on stderr, one per table of the suite (side by side
    they would not fit a terminal)."""
    title = str(suite.get("title") or suite.get("suite"))
    for t in suite["tables"]:
        header, rows = suite_table(suite | {"tables": [t]}, runs)
        print_compare(header, rows, title=f"{title}: {t['title']}" if len(suite["tables"]) > 1 and t.get("title") else title)
