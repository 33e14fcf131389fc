"""evaluate: per-group perplexity on held-out shards and few-shot benchmarks (SPEC §10).

``cptkit evaluate --model M --in heldout/ --out eval/ eval.ppl.group_by=topic`` scores loss and
perplexity per group with :func:`cptkit.lm.group_losses` (the code path of ``train``'s mixture
controllers); ``eval.tasks=[...]`` runs benchmark tasks (``conf/eval/tasks/*.yaml``). Both may
be combined. Output: ``OUT/_results.json`` (every number, with model, task versions and hashes,
config), ``OUT/part-*.jsonl.gz`` (one record per benchmark item: prediction, gold, score).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from cptkit.config import CONF_DIR, JobConfig, register_step
from cptkit.errors import CptkitError
from cptkit.job import Job, Task
from cptkit.progress import console, log
from cptkit.shards import atomic_write_json

RESULTS = "_results.json"


@dataclass
class PplConfig:
    group_by: str | None = None  # record field: domain, topic, lang, source...; null: one group "all"
    max_docs_per_group: int | None = 500  # first N documents of each group (input order)
    max_length: int = 1024  # tokens per scored window
    max_tokens: int | None = None  # cap on tokens scored per document
    text_field: str = "text"


@dataclass
class EvalConfig:
    model: str | None = None  # HF dir, .gguf file, or smollm2
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 8
    max_length: int | None = None  # benchmark context length; null: the model's
    ppl: PplConfig = field(default_factory=PplConfig)
    tasks: list[str] = field(default_factory=list)
    shots: int | None = None  # override every task's num_fewshot (null: task default, App. F)
    limit: int | None = None  # first N test items per task
    fewshot_seed: int = 1234  # lm-eval's default
    max_gen_toks: int | None = None  # override generative tasks' max_gen_toks
    task_dir: str | None = None  # null: conf/eval/tasks
    data_dir: str = "~/.cache/cptkit/eval"


@dataclass
class EvaluateJob(JobConfig):
    eval: EvalConfig = field(default_factory=EvalConfig)


register_step("evaluate", EvaluateJob)


def task_dir(ec) -> str:
    return str(ec.task_dir or CONF_DIR / "eval" / "tasks")


def model_info(spec: str, model) -> dict[str, Any]:
    """What identifies the model in the results: spec, class, parameters, weight-file hash."""
    import hashlib

    info: dict[str, Any] = {"spec": spec, "class": type(model).__name__,
                            "parameters": sum(p.numel() for p in model.parameters())}
    p = Path(spec)
    files = sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")) if p.is_dir() else ([p] if p.is_file() else [])
    if files:
        h = hashlib.sha256()
        for f in files:
            h.update(f.name.encode())
            h.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
        info["weights_hash"] = h.hexdigest()[:16]
    return info


def run(cfg: DictConfig) -> dict:
    """Perplexity per group (when inputs are given) and benchmark tasks (when ``eval.tasks``)."""
    from cptkit import lm
    from cptkit.eval import tasks as T
    from cptkit.shards import resolve_inputs

    ec = cfg.eval
    if not ec.model:
        raise CptkitError("no model given: pass --model DIR (a HF model dir, a .gguf file, or smollm2)")
    inputs = resolve_inputs(list(cfg.io.inputs)) if cfg.io.inputs else []
    task_names = list(ec.tasks or [])
    if not inputs and not task_names:
        raise CptkitError("nothing to evaluate: pass --in HELDOUT for perplexity and/or eval.tasks=[...]")
    # Load task definitions (and data) before the model: bad task files fail fast.
    etasks = [T.load_task(n, task_dir(ec), ec.data_dir) for n in task_names]
    for t in etasks:
        T.load_docs(t, t.spec["test_split"])
    with Job(cfg, inputs=inputs, tasks=[Task(0, inputs, name="eval")], needs_inputs=False) as job:
        results: dict[str, Any] = {}
        rows: dict[str, Any] = {}
        for task in job.pending():
            t0 = time.time()
            tok = lm.load_tokenizer(ec.model)
            model = lm.load_causal_lm(ec.model, dtype=ec.dtype, device=ec.device)
            results = {"model": model_info(str(ec.model), model), "perplexity": None, "tasks": {}}
            if inputs:
                pc = ec.ppl
                groups = lm.group_losses(model, tok, job.read(task), pc.group_by, pc.max_docs_per_group,
                                         batch_size=int(ec.batch_size), max_length=int(pc.max_length),
                                         text_field=str(pc.text_field), max_tokens=pc.max_tokens)
                tokens = sum(g["tokens"] for g in groups.values())
                nll = sum(g["loss"] * g["tokens"] for g in groups.values() if g["tokens"])
                overall = nll / tokens if tokens else float("nan")
                results["perplexity"] = {"group_by": pc.group_by, "groups": groups,
                                         "all": {"loss": overall, "ppl": math.exp(overall) if tokens else float("nan"),
                                                 "tokens": tokens, "docs": sum(g["docs"] for g in groups.values())}}
            with job.writer(task) as w:
                for et in etasks:
                    n_items = len(T.load_docs(et, et.spec["test_split"])[: ec.limit or None])
                    advance = job.add_bar(et.name, n_items * (4 if et.output_type == T.MC else 1))
                    ts = time.time()
                    metrics, items = T.run_task(model, tok, et, num_fewshot=ec.shots, limit=ec.limit,
                                                seed=int(ec.fewshot_seed), batch_size=int(ec.batch_size),
                                                max_gen_toks=ec.max_gen_toks, max_length=ec.max_length,
                                                on_batch=advance)
                    metrics["seconds"] = time.time() - ts
                    results["tasks"][et.name] = {"metrics": metrics, "version": et.version, "hash": et.hash(),
                                                 "file": str(et.path), "output_type": et.output_type}
                    for it in items:
                        w.write({"id": f"{et.name}/{it['id']}", "text": it.pop("question"), "task": et.name, **it})
            results["config"] = job.config
            results["seconds"] = time.time() - t0
            atomic_write_json(job.out / RESULTS, results)
            job.complete(task, w, seconds=results["seconds"])
        if not results and (job.out / RESULTS).exists():
            results = json.loads((job.out / RESULTS).read_text())
        if results:
            print_results(results)
        rows = summary_rows(results)
        return job.finish(extra=rows)


def summary_rows(results: dict) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    ppl = results.get("perplexity")
    if ppl:
        rows["ppl (all)"] = ppl["all"]["ppl"]
        rows["tokens scored"] = ppl["all"]["tokens"]
    for name, r in (results.get("tasks") or {}).items():
        m = r["metrics"]
        key = "acc_norm" if "acc_norm" in m else "exact_match"
        rows[f"{name} {key}"] = m[key]
    return rows


def print_results(results: dict) -> None:
    """Rich tables on stderr: perplexity per group, then benchmark metrics."""
    from rich.table import Table

    ppl = results.get("perplexity")
    if ppl:
        t = Table(title=f"perplexity by {ppl['group_by'] or 'all'}", header_style="bold")
        for c in ("group", "docs", "tokens", "loss", "ppl"):
            t.add_column(c, justify="left" if c == "group" else "right")
        for g, v in list(ppl["groups"].items()) + [("ALL", ppl["all"])]:
            t.add_row(str(g), str(v["docs"]), f"{v['tokens']:,}", f"{v['loss']:.4f}", f"{v['ppl']:.3f}")
        console.print(t)
    if results.get("tasks"):
        t = Table(title="benchmarks", header_style="bold")
        for c in ("task", "shots", "n", "metric", "value", "± stderr"):
            t.add_column(c, justify="left" if c in ("task", "metric") else "right")
        for name, r in results["tasks"].items():
            m = r["metrics"]
            for k in ("acc", "acc_norm", "exact_match"):
                if k in m:
                    t.add_row(name, str(m["num_fewshot"]), str(m["n"]), k, f"{m[k]:.4f}", f"{m[k + '_stderr']:.4f}")
        console.print(t)
    log.debug("results: %s", json.dumps({k: v for k, v in results.items() if k != "config"})[:2000])
