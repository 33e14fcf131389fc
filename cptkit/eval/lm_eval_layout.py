"""``evaluate``'s task scores in lm-evaluation-harness's results layout (``OUT/_lm_eval/results_<date>.json``), so
tools that read lm-eval results (``lm_eval.utils.make_table``, its results-file helpers, loggers, leaderboard
scripts) read cptkit's.

The layout is lm-eval 0.4's ``EvalResults`` (``lm_eval/result_schema.py``): ``results`` (per task
``alias``, ``name``, ``sample_len`` and ``metric,filter`` keys such as ``acc,none`` and
``acc_stderr,none``), ``versions``, ``n-shot``, ``configs``, ``higher_is_better``, ``n-samples``,
``group_subtasks`` and ``config`` (model and run settings), plus ``model_name``. Tasks run with
``eval.engine=lm_eval`` keep lm-eval's own version, config, ``higher_is_better`` and sample counts.
Perplexity groups are not tasks and stay in ``_results.json`` only. Nothing in the file depends on the
clock; its name carries the run's start time in lm-eval's ``date_id`` form (the ``timings.started`` of
``_manifest.json``), as lm-eval names its own files and reads the latest one by it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

COUNTS = {"n", "n_executable", "num_fewshot", "seconds"}  # numbers in cptkit's metrics that are not scores
KEYS = ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples")  # per task, lm-eval's order
LOWER_IS_BETTER = ("perplexity", "bits_per_byte", "loss")  # metric names where less is better


LM_EVAL_DIR = "_lm_eval"  # under a step's output: skipped when the output is read as data


def results_name(started: float) -> str:
    """``results_<date_id>.json``: lm-eval's ``EvaluationTracker`` name for the run started at ``started``."""
    return f"results_{datetime.fromtimestamp(started).isoformat().replace(':', '-')}.json"


def metric_key(name: str) -> str:
    """cptkit's metric name -> lm-eval's ``metric,filter`` key: ``acc`` -> ``acc,none``, ``acc_stderr`` ->
    ``acc_stderr,none``, ``exact_match/flexible-extract_stderr`` -> ``exact_match_stderr,flexible-extract``."""
    stderr = name.endswith("_stderr")
    base = name.removesuffix("_stderr")
    metric, _, filt = base.partition("/")
    return f"{metric}{'_stderr' if stderr else ''},{filt or 'none'}"


def higher_is_better(metric: str) -> bool:
    return not any(w in metric for w in LOWER_IS_BETTER)


def sanitize_model_name(name: str) -> str:
    """A model name safe in a path, as lm-eval's ``sanitize_model_name`` makes it."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def _version(v: Any) -> float | str | None:
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def task_entry(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """One task of ``_results.json`` -> its parts of the layout: ``results``, ``versions``, ``n-shot``,
    ``configs``, ``higher_is_better`` and ``n-samples`` entries."""
    m, theirs = entry["metrics"], entry.get("lm_eval") or {}
    scores = {metric_key(k): ("N/A" if v is None else v) if k.endswith("_stderr") else v
              for k, v in m.items() if k not in COUNTS and (k.endswith("_stderr") or v is not None)
              and (v is None or isinstance(v, (int, float)))}
    n, shots = int(m.get("n") or 0), int(m.get("num_fewshot") or 0)
    config = theirs.get("config") or {
        "task": name, "output_type": entry.get("output_type"), "num_fewshot": shots,
        "metric_list": [{"metric": k.split(",")[0], "higher_is_better": higher_is_better(k)}
                        for k in scores if "_stderr," not in k],
        "metadata": {"version": _version(entry.get("version")), "cptkit_task_file": entry.get("file"),
                     "cptkit_task_hash": entry.get("hash"), "data": entry.get("data")}}
    return {"results": {"alias": name, "name": name, "sample_len": n, **scores},
            "versions": _version(theirs.get("version", entry.get("version"))),
            "n-shot": shots,
            "configs": config,
            "higher_is_better": theirs.get("higher_is_better") or {
                k.split(",")[0]: higher_is_better(k) for k in scores if "_stderr," not in k},
            "n-samples": theirs.get("n_samples") or {"original": int(entry.get("n_docs") or n), "effective": n}}


def to_lm_eval(results: dict[str, Any]) -> dict[str, Any]:
    """``_results.json`` -> lm-eval's results layout (the module docstring says what is in it)."""
    parts = {name: task_entry(name, entry) for name, entry in sorted((results.get("tasks") or {}).items())}
    out: dict[str, Any] = {key: {name: p[key] for name, p in parts.items()} if key in KEYS else {}
                           for key in ("results", "group_subtasks", *KEYS[1:])}  # cptkit tasks form no groups
    model = results.get("model") or {}
    ec = (results.get("config") or {}).get("eval") or {}
    spec = str(model.get("spec") or ec.get("model") or "")
    out["config"] = {"model": spec, "model_args": None, "model_num_parameters": model.get("parameters"),
                     "model_dtype": ec.get("dtype"), "batch_size": ec.get("batch_size"), "batch_sizes": [],
                     "device": ec.get("device"), "use_cache": None, "limit": ec.get("limit"),
                     "gen_kwargs": {"max_gen_toks": ec["max_gen_toks"]} if ec.get("max_gen_toks") else None,
                     "fewshot_seed": ec.get("fewshot_seed")}
    out |= {"model_source": "cptkit", "model_name": spec, "model_name_sanitized": sanitize_model_name(spec)}
    return out
