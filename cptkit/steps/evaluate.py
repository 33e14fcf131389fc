"""evaluate: perplexity per group on held-out shards (--in, eval.ppl.group_by=FIELD) and few-shot
benchmarks (eval.tasks=[...], conf/eval/tasks/*.yaml) scored as lm-evaluation-harness does (SPEC §10).

``cptkit evaluate --model M --in heldout/ --out eval/ eval.ppl.group_by=topic`` scores loss and
perplexity per group with :func:`cptkit.models.scoring.group_losses` (the code path of ``train``'s mixture
controllers); ``eval.tasks=[...]`` runs benchmark tasks (``conf/eval/tasks/*.yaml``), or
``eval.suite=NAME`` a paper's table (``conf/eval/suites/NAME.yaml``). ``eval.engine=lm_eval``
runs lm-evaluation-harness tasks by name on the same loaded model instead. With
``eval.contamination=DIR`` (an ``evaluate-contamination`` output) every task is also scored on
its clean and its contaminated items separately. Output: ``OUT/_results.json`` (every number,
with standard errors, model, task versions and hashes, config), ``OUT/_lm_eval/results_<date>.json`` (the task
scores in lm-evaluation-harness's results layout: :mod:`cptkit.eval.lm_eval_layout`),
``OUT/part-*.jsonl.gz`` (one record per benchmark item: prediction, gold, score).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit.core.config import CONF_DIR, JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Hooks, Job, Task
from cptkit.core.progress import console, log
from cptkit.core.run import Run
from cptkit.core.shards import atomic_write_json
from cptkit.core.step import IN, OUT, QUIET, SKIP_BAD, Option, step
from cptkit.eval.lm_eval_engine import run_lm_eval
from cptkit.eval.lm_eval_layout import LM_EVAL_DIR, results_name, to_lm_eval

RESULTS = "_results.json"
ENGINES = ("cptkit", "lm_eval")


@dataclass
class PplConfig:
    group_by: str | None = None  # record field: domain, topic, lang, source...; null: one group "all"
    max_docs_per_group: int | None = 500  # first N documents of each group (input order)
    max_length: int = 1024  # tokens per scored window
    max_tokens: int | None = None  # cap on tokens scored per document
    text_field: str = "text"
    groups: list[str] | None = None  # score only the records of these groups (null: every group)

    def __post_init__(self) -> None:
        check(self.groups is None or bool(self.group_by), "groups", self.groups,
              "needs group_by (the field that names a record's group)")


@dataclass
class LmEvalConfig:
    include_path: str | None = None  # folder of extra lm-eval task YAMLs (local tasks)
    allow_code: bool = False  # lm-eval's confirm_run_unsafe_code (its code tasks run unsandboxed)


@dataclass
class CodeConfig:
    # run HumanEval/MBPP programs with only a Python-level guard where the OS sandbox (user/net/pid/mount
    # namespaces) is unavailable; false: refuse (docs/evaluate.md "Sandbox: threat model")
    allow_unsandboxed: bool = False


@dataclass
class EvalConfig:
    model: str | None = None  # HF dir, .gguf file, or smollm2
    dtype: str = "float32"
    device: str = "auto"  # auto (the GPU when there is one) | cpu | cuda | cuda:N
    batch_size: int = 8
    max_length: int | None = None  # benchmark context length; null: the model's
    ppl: PplConfig = field(default_factory=PplConfig)
    tasks: list[str] = field(default_factory=list)
    shots: int | None = None  # override every task's num_fewshot (null: task default, App. F)
    limit: int | None = None  # first N test items per task
    sample_seed: int | None = None  # with limit: N items drawn with this seed, not the first N
    fewshot_seed: int = 1234  # lm-eval's default
    max_gen_toks: int | None = None  # override generative tasks' max_gen_toks
    task_dir: str | None = None  # null: conf/eval/tasks
    data_dir: str = "~/.cache/cptkit/eval"
    engine: str = "cptkit"  # cptkit | lm_eval (tasks are then lm-eval task names)
    lm_eval: LmEvalConfig = field(default_factory=LmEvalConfig)
    code: CodeConfig = field(default_factory=CodeConfig)
    suite: str | None = None  # conf/eval/suites/<name>.yaml (or a path): a paper's table
    task_shots: Any = None  # per-task shots {task: n} (a suite sets them)
    contamination: str | None = None  # evaluate-contamination output: clean/contaminated split

    def __post_init__(self) -> None:
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        check(self.limit is None or self.limit >= 1, "limit", self.limit, "must be >= 1 (null: all items)")
        check(self.sample_seed is None or self.engine == "cptkit", "sample_seed", self.sample_seed,
              "draws items under eval.engine=cptkit only (lm-eval takes the first eval.limit)")
        check(self.shots is None or self.shots >= 0, "shots", self.shots, "must be >= 0")
        check(self.engine in ENGINES, "engine", self.engine, "must be cptkit or lm_eval")
        check(self.task_shots is None or isinstance(self.task_shots, dict), "task_shots", self.task_shots,
              "use a mapping, e.g. eval.task_shots={gsm8k: 8}")


@dataclass
class EvaluateJob(JobConfig):
    trust_remote_code: bool = False  # let the --model folder run its own Python code (auto_map)
    eval: EvalConfig = field(default_factory=EvalConfig)


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


def perplexity(model: Any, tok: Any, records: Any, ec: Any) -> dict[str, Any]:
    """Per-group and overall loss / perplexity of ``model`` on ``records`` (``eval.ppl``)."""
    from cptkit.models import scoring  # deferred: torch

    pc = ec.ppl
    if pc.groups is not None:  # validated: group_by is set
        keep = {str(g) for g in pc.groups}
        records = (r for r in records if str(r.get(pc.group_by)) in keep)
    groups = scoring.group_losses(model, tok, records, pc.group_by, pc.max_docs_per_group, batch_size=ec.batch_size,
                                  max_length=pc.max_length, text_field=pc.text_field, max_tokens=pc.max_tokens,
                                  per_doc=True)
    tokens = sum(g["tokens"] for g in groups.values())
    nll = sum(g["loss"] * g["tokens"] for g in groups.values() if g["tokens"])
    overall = nll / tokens if tokens else float("nan")
    return {"group_by": pc.group_by, "groups": groups,
            "all": {"loss": overall, "ppl": math.exp(overall) if tokens else float("nan"),
                    "tokens": tokens, "docs": sum(g["docs"] for g in groups.values())}}


def run_lm_eval_tasks(model: Any, tok: Any, task_names: list[str], ec: Any, results: dict, contam: dict | None,
                      w: Any) -> None:
    """``eval.engine=lm_eval``: run ``task_names`` through lm-evaluation-harness; items to ``w``."""
    ts = time.time()
    done = run_lm_eval(model, tok, task_names, num_fewshot=ec.shots, limit=ec.limit, batch_size=ec.batch_size,
                       seed=ec.fewshot_seed, max_length=ec.max_length, include_path=ec.lm_eval.include_path,
                       allow_code=ec.lm_eval.allow_code, max_gen_toks=ec.max_gen_toks)
    for name, (metrics, items, meta) in done.items():
        metrics["seconds"] = time.time() - ts
        results["tasks"][name] = {"metrics": metrics, "engine": "lm_eval", "lm_eval": meta}
        _add_split(results["tasks"][name], items, contam, name)
        for it in items:
            w.write({"id": f"{name}/{it['id']}", "text": it.pop("question"), "task": name, **it})


def run_native_task(model: Any, tok: Any, et: Any, ec: Any, shots_for: dict, results: dict, contam: dict | None,
                    w: Any, job: Job) -> None:
    """One task of cptkit's own engine: its metrics into ``results``, its items to ``w``."""
    from cptkit.eval import (  # deferred: the eval task modules (~30 ms on --help)
        runner,
        task_data,
        tasks,
        templates,
    )

    n_docs = len(task_data.load_docs(et, et.spec["test_split"]))
    n_items = min(n_docs, ec.limit or n_docs)
    advance = job.add_bar(et.name, n_items * (4 if et.output_type == tasks.MC else 1))
    ts = time.time()
    shots = ec.shots if ec.shots is not None else shots_for.get(et.name, shots_for.get(str(et.path.stem)))
    with templates.naming_file(et):  # a template that fails on a later document: one line naming the task file
        metrics, items = runner.run_task(model, tok, et, num_fewshot=shots, limit=ec.limit, seed=ec.fewshot_seed,
                                         batch_size=ec.batch_size, max_gen_toks=ec.max_gen_toks,
                                         max_length=ec.max_length, on_batch=advance,
                                         allow_unsandboxed=ec.code.allow_unsandboxed, sample_seed=ec.sample_seed)
    metrics["seconds"] = time.time() - ts
    results["tasks"][et.name] = {"metrics": metrics, "version": et.version, "hash": et.hash(),
                                 "file": str(et.path), "output_type": et.output_type, "data": dict(et.sources),
                                 "n_docs": n_docs, "sample_seed": ec.sample_seed}
    if "n_executable" in metrics:
        from cptkit.eval.cmdgen import NOTE, THRESHOLD  # deferred: eval.cmdgen, ~10 ms

        thr = (et.spec.get("cmd_eval") or {}).get("threshold", THRESHOLD)
        results["tasks"][et.name]["note"] = NOTE.format(thr=thr)
    _add_split(results["tasks"][et.name], items, contam, et.name)
    for it in items:
        w.write({"id": f"{et.name}/{it['id']}", "text": it.pop("question"), "task": et.name, **it})


MODEL = Option(("--model",), "eval.model", "HF model dir, .gguf file, or smollm2.", metavar="MODEL")


@step("evaluate", EvaluateJob, options=(MODEL, IN, OUT, QUIET, SKIP_BAD), order=150)
def run(conf: EvaluateJob, ctx: Run) -> dict:
    """Perplexity per group (when inputs are given) and benchmark tasks (when ``eval.tasks``)."""
    from cptkit.eval import (  # deferred: the eval task modules (~30 ms on --help)
        task_data,
        tasks,
        templates,
    )
    from cptkit.models import lm  # deferred: torch

    ec = conf.eval
    if not ec.model:
        raise CptkitError("no model given: pass --model DIR (a HF model dir, a .gguf file, or smollm2)")
    model_spec = ec.model
    lm.check_model(model_spec, conf.trust_remote_code)  # remote code, a bad GGUF: before any output is touched
    inputs = ctx.resolve_inputs() if conf.io.inputs else []
    suite = load_suite(ec.suite) if ec.suite else None
    task_names = ec.tasks or (list(suite["tasks"]) if suite else [])
    shots_for = dict(suite["tasks"]) if suite else {}
    shots_for |= {str(k): int(v) for k, v in (ec.task_shots or {}).items()}  # Any-typed: keys, values as written
    if not inputs and not task_names:
        raise CptkitError("nothing to evaluate: pass --in HELDOUT for perplexity and/or eval.tasks=[...] / eval.suite=NAME")
    # Load task definitions (and data) before the model: bad task files and missing data fail fast.
    etasks = [] if ec.engine == "lm_eval" else [tasks.load_task(n, tasks.task_dir(ec), ec.data_dir) for n in task_names]
    for t in etasks:
        task_data.load_docs(t, t.spec["test_split"])
        templates.check_templates(t)  # sandboxed; a refused or broken template names its task file
    if any(t.spec.get("code_eval") for t in etasks):
        from cptkit.eval.code_exec import require_sandbox  # deferred: ctypes, ~8 ms

        require_sandbox(ec.code.allow_unsandboxed)  # refuse before loading the model, not after generating
    for t in etasks:
        if t.spec.get("cmd_eval") is not None:  # CmdGen: the sandbox (no fallback) and the embedding model
            from cptkit.eval.cmdgen import preflight  # deferred: eval.cmdgen, ~10 ms

            preflight(dict(t.spec["cmd_eval"] or {}))
    contam = load_contamination(ec.contamination, [t.name for t in etasks] or task_names) if ec.contamination else None
    from cptkit.models.lm import spec_file  # deferred: torch

    with Job(ctx, inputs=inputs, tasks=[Task(0, inputs, name="eval")], needs_inputs=False,
             reads=[spec_file(model_spec)], hooks=Hooks(before_complete=write_lm_eval_results)) as job:
        results: dict[str, Any] = {}
        rows: dict[str, Any] = {}
        for task in job.pending():
            t0 = time.time()
            tok = lm.load_tokenizer(model_spec, conf.trust_remote_code)
            model = lm.load_causal_lm(model_spec, dtype=ec.dtype, device=ec.device,
                                      trust_remote_code=conf.trust_remote_code)
            results = {"model": model_info(model_spec, model), "engine": ec.engine, "perplexity": None, "tasks": {}}
            if suite:
                results["suite"] = {"name": suite["suite"], "file": suite["_path"]}
            if inputs:
                results["perplexity"] = perplexity(model, tok, job.read(task), ec)
            with job.writer(task) as w:
                if ec.engine == "lm_eval":
                    run_lm_eval_tasks(model, tok, task_names, ec, results, contam, w)
                for et in etasks:
                    run_native_task(model, tok, et, ec, shots_for, results, contam, w, job)
            if contam:
                results["contamination"] = {"report": contam["_path"], "ngram": contam.get("ngram")}
            results["config"] = job.config
            results["seconds"] = time.time() - t0
            job.write_json(RESULTS, results)
            job.complete(task, w, seconds=results["seconds"])
        if not results and job.file(RESULTS).exists():
            results = json.loads(job.file(RESULTS).read_text())
        if results and not job.quiet:
            print_results(results)
            if suite:
                from cptkit.eval.compare import print_suite  # deferred: eval.compare, ~5 ms

                print_suite(suite, {"this run": results})
        rows = summary_rows(results)
        return job.finish(extra=rows)



def write_lm_eval_results(job: Job) -> None:
    """The task scores again in lm-evaluation-harness's layout, ``OUT/_lm_eval/results_<date_id>.json``,
    named by the run's start as ``_manifest.json`` records it (``timings.started``); nothing when no task
    ran. The folder starts with ``_`` so that the output read as data (``--in OUT``) skips it, and the
    name keeps ``/results_``, which lm-eval's helpers look for."""
    f = job.file(RESULTS)
    results = json.loads(f.read_text()) if f.exists() else {}
    if not results.get("tasks"):
        return
    folder = job.file(LM_EVAL_DIR)
    folder.mkdir(exist_ok=True)
    for old in folder.glob("results_*.json"):  # an earlier, unfinished run's
        old.unlink()
    atomic_write_json(folder / results_name(job.t0), to_lm_eval(results))


def load_suite(name: str) -> dict[str, Any]:
    """A paper's scorecard: ``conf/eval/suites/<name>.yaml`` (or a path)."""
    import yaml

    p = Path(name) if name.endswith((".yaml", ".yml")) else CONF_DIR / "eval" / "suites" / f"{name}.yaml"
    if not p.is_file():
        have = sorted(x.stem for x in (CONF_DIR / "eval" / "suites").glob("*.yaml"))
        raise CptkitError(f"eval.suite={name!r}: no {p} (suites: {', '.join(have) or 'none'})")
    s = yaml.safe_load(p.read_text())
    if not isinstance(s, dict) or not isinstance(s.get("tasks"), dict) or not s.get("tables"):
        raise CptkitError(f"{p}: a suite needs `tasks` (name: shots) and `tables`")
    s.setdefault("suite", p.stem)
    s["_path"] = str(p)
    return s


def load_contamination(path: str, tasks: list[str]) -> dict[str, Any]:
    """The ``_contamination.json`` of ``evaluate-contamination`` (a dir or the file), checked to cover ``tasks``."""
    from cptkit.eval.contamination import REPORT  # deferred: numpy

    p = Path(path).expanduser()
    f = p / REPORT if p.is_dir() else p
    if not f.is_file():
        raise CptkitError(f"eval.contamination={path}: no {REPORT} (the --out of cptkit evaluate-contamination)")
    try:
        rep = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CptkitError(f"{f}:{e.lineno}: malformed JSON: {e.msg}") from None
    bench = rep.get("benchmarks") or {}
    for t in tasks:
        if t not in bench:
            raise CptkitError(f"{f}: no benchmark {t!r} (run evaluate-contamination with eval.tasks=[...,{t}])")
        if "test_items_hit_ids" not in bench[t]:
            raise CptkitError(f"{f}: benchmark {t!r} has no test_items_hit_ids (rerun evaluate-contamination)")
    return rep | {"_path": str(f)}


def _add_split(entry: dict, items: list[dict], contam: dict | None, name: str) -> None:
    from cptkit.eval import runner  # deferred: the eval task modules (~30 ms on --help)

    if contam is None:
        return
    hit = {str(x) for x in contam["benchmarks"][name]["test_items_hit_ids"]}
    entry["split"] = runner.split_metrics(items, hit)


def summary_rows(results: dict) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    ppl = results.get("perplexity")
    if ppl:
        rows["ppl (all)"] = ppl["all"]["ppl"]
        rows["tokens scored"] = ppl["all"]["tokens"]
    from cptkit.eval.compare import headline  # deferred: eval.compare, ~5 ms

    for name, r in (results.get("tasks") or {}).items():
        key, v = headline(r["metrics"])
        rows[f"{name} {key}"] = v
    return rows


def metric_keys(m: dict) -> list[str]:
    """The score keys of a metrics dict (not stderr, n, num_fewshot, seconds)."""
    skip = {"n", "n_executable", "num_fewshot", "seconds"}
    return [k for k, v in m.items() if k not in skip and not k.endswith("_stderr") and (v is None or isinstance(v, (int, float)))]


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
        split = any("split" in r for r in results["tasks"].values())
        t = Table(title="benchmarks", header_style="bold")
        cols = ["task", "shots", "n", "metric", "value", "± stderr"]
        cols += ["clean (n)", "contaminated (n)"] if split else []
        for c in cols:
            t.add_column(c, justify="left" if c in ("task", "metric") else "right")

        def fmt(v: Any) -> str:
            return "–" if v is None else f"{v:.4f}"

        for name, r in results["tasks"].items():
            m = r["metrics"]
            for k in metric_keys(m):
                n = m.get("n_executable") if k in ("output_sim", "sr") and "n_executable" in m else m.get("n")
                row = [name, str(m.get("num_fewshot")), str(n), k, fmt(m[k]), fmt(m.get(k + "_stderr"))]
                if split:
                    sp = r.get("split") or {}
                    row += [f"{fmt(sp[p].get(k))} ({sp[p]['n']})" if p in sp else "–" for p in ("clean", "contaminated")]
                t.add_row(*row)
        console.print(t)
        for name, r in results["tasks"].items():
            if r.get("note"):
                console.print(f"{name}: n_executable={r['metrics'].get('n_executable')} of n={r['metrics'].get('n')}; "
                              f"{r['note']}")
    log.debug("results: %s", json.dumps({k: v for k, v in results.items() if k != "config"})[:2000])
