"""``eval.engine=lm_eval``: any lm-evaluation-harness task by name, run on cptkit's loaded model.

The model ``evaluate`` loaded (and its tokenizer) are wrapped in lm-eval's ``HFLM`` and passed
to ``lm_eval.simple_evaluate``; its results are converted to cptkit's ``_results.json`` shape
(``metrics: {acc, acc_stderr, ..., n, num_fewshot}``) and its per-sample records to cptkit's
item records. ``eval.lm_eval.include_path`` adds a folder of lm-eval task YAMLs (local tasks,
``dataset_path: json`` with ``data_files``). Code tasks need ``eval.lm_eval.allow_code=true``
(lm-eval's ``confirm_run_unsafe_code``; lm-eval runs that code unsandboxed).
"""

from __future__ import annotations

import json
import math
from typing import Any

from cptkit.core.errors import CptkitError


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def convert_results(out: dict, task: str) -> tuple[dict[str, Any], list[dict]]:
    """``(metrics, items)`` in cptkit's layout from one task of ``simple_evaluate``'s output.

    lm-eval's ``"acc,none"`` / ``"acc_stderr,none"`` become ``acc`` / ``acc_stderr`` (the filter
    name is kept when it is not ``none``: ``exact_match,flexible-extract`` → ``exact_match/flexible-extract``).
    """
    res = out["results"].get(task)
    if res is None:
        raise CptkitError(f"lm-eval returned no results for task {task!r} (have: {', '.join(out['results'])})")
    metrics: dict[str, Any] = {}
    for key, v in res.items():
        if "," not in key:
            continue
        name, filt = key.split(",", 1)
        stderr = name.endswith("_stderr")
        base = name.removesuffix("_stderr")
        label = base if filt == "none" else f"{base}/{filt}"
        metrics[f"{label}_stderr" if stderr else label] = _num(v)
    ns = (out.get("n-samples") or {}).get(task) or {}
    metrics["n"] = int(ns.get("effective", ns.get("original", 0)))
    metrics["num_fewshot"] = (out.get("n-shot") or {}).get(task)
    items = []
    for s in sorted((out.get("samples") or {}).get(task, []), key=lambda s: s["doc_id"]):
        it: dict[str, Any] = {"doc": int(s["doc_id"]), "id": str(s["doc_id"]), "target": str(s.get("target"))}
        for m in (s.get("metrics") or []):
            if m in s and _num(s[m]) is not None:
                it[m] = float(s[m])
        for key in ("resps", "filtered_resps"):  # raw model outputs, and after the task's filters
            v = s.get(key)
            if isinstance(v, list):
                flat = [r[0] if isinstance(r, (list, tuple)) and len(r) == 1 else r for r in v]
                it[key] = [x if isinstance(x, (int, float, str)) else [str(y) for y in x] if isinstance(x, (list, tuple))
                           else str(x) for x in flat][:10]
        it["question"] = str(s["arguments"][0][0]) if s.get("arguments") else ""
        items.append(it)
    return metrics, items


def task_meta(out: dict, task: str) -> dict[str, Any]:
    """lm-eval's own version, config, ``higher_is_better`` and sample counts of ``task`` (JSON-safe), for
    the lm-eval-layout results file (:mod:`cptkit.eval.lm_eval_layout`)."""
    meta = {"version": (out.get("versions") or {}).get(task), "config": (out.get("configs") or {}).get(task),
            "higher_is_better": (out.get("higher_is_better") or {}).get(task),
            "n_samples": (out.get("n-samples") or {}).get(task)}
    return json.loads(json.dumps(meta, default=str))


def run_lm_eval(model, tokenizer, tasks: list[str], num_fewshot: int | None = None, limit: int | None = None,
                batch_size: int = 8, seed: int = 1234, max_length: int | None = None,
                include_path: str | None = None, allow_code: bool = False,
                max_gen_toks: int | None = None) -> dict[str, tuple[dict[str, Any], list[dict], dict[str, Any]]]:
    """Run lm-eval ``tasks`` on the loaded ``model``: ``{task: (metrics, items, lm-eval's task meta)}``."""
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise CptkitError("eval.engine=lm_eval needs lm-evaluation-harness: pip install 'lm_eval>=0.4.13'") from None
    tm = TaskManager(include_path=include_path) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        raise CptkitError(f"lm-eval has no task {unknown[0]!r}"
                          + ("" if include_path else " (local task YAMLs: eval.lm_eval.include_path=DIR)"))
    lm_obj = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=int(batch_size), max_length=max_length,
                  device=str(next(model.parameters()).device))
    kw: dict[str, Any] = {}
    if max_gen_toks:
        kw["gen_kwargs"] = {"max_gen_toks": int(max_gen_toks)}
    out = lm_eval.simple_evaluate(model=lm_obj, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                                  log_samples=True, task_manager=tm, random_seed=seed, numpy_random_seed=seed,
                                  torch_random_seed=seed, fewshot_random_seed=seed, bootstrap_iters=1000,
                                  confirm_run_unsafe_code=bool(allow_code), **kw)
    if out is None:
        raise CptkitError("lm-eval returned nothing (not rank 0?)")
    return {t: (*convert_results(out, t), task_meta(out, t)) for t in tasks}
