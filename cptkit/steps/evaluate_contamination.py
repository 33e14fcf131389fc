"""evaluate-contamination: share of documents with an n-gram overlap (eval.ngram=8) with benchmarks'
test items, share of test items hit; eval.action=none|flag|drop (SPEC §10, Retrieve-Pile Table 6).

``cptkit evaluate-contamination --in docs/ --out contam/ eval.tasks=[gcide_defs] eval.ngram=8``
writes ``OUT/_contamination.json`` (per benchmark: share of documents with an overlap, share of
test items hit, the ids of the items hit, which ``evaluate eval.contamination=OUT`` uses to
score clean and contaminated items separately) and, with ``eval.action=flag`` every document with a ``contaminated`` field
(the benchmarks it overlaps), with ``eval.action=drop`` only the clean documents. One task per
input shard, so it resumes and splits over ``shard.count`` processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.table import Table

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job
from cptkit.core.progress import console
from cptkit.core.run import Run
from cptkit.core.step import step

ACTIONS = ("none", "flag", "drop")
ITEM_TEXTS = ("question", "question+answer")


@dataclass
class ContamConfig:
    tasks: list[str] = field(default_factory=list)
    ngram: int = 8  # Retrieve-Pile Table 6; 13 as lm-eval's decontamination
    action: str = "none"  # none (report only) | flag (add a field) | drop (keep clean documents)
    flag_field: str = "contaminated"
    item_text: str = "question+answer"  # what of a test item is matched: question | question+answer
    limit: int | None = None  # first N test items per task
    task_dir: str | None = None
    data_dir: str = "~/.cache/cptkit/eval"

    def __post_init__(self) -> None:
        check(self.ngram >= 1, "ngram", self.ngram, "must be ≥ 1")
        check(self.action in ACTIONS, "action", self.action, f"use one of {', '.join(ACTIONS)}")
        check(self.item_text in ITEM_TEXTS, "item_text", self.item_text, f"use one of {', '.join(ITEM_TEXTS)}")


@dataclass
class EvaluateContaminationJob(JobConfig):
    eval: ContamConfig = field(default_factory=ContamConfig)


def item_texts(task, limit: int | None, mode: str) -> list[str]:
    """The texts of a task's test items matched against documents.

    The task's ``doc_to_decontamination_query`` when it has one (lm-eval's key; keeps prompt
    boilerplate such as "Word:"/"Definition:" out of the n-grams), else the rendered question,
    plus the answer in ``question+answer`` mode.
    """
    from cptkit.eval import (  # deferred: the eval task modules (~30 ms on --help)
        task_data,
        tasks,
        templates,
    )

    docs = task_data.load_docs(task, task.spec["test_split"])[: limit or None]
    if task.spec.get("doc_to_decontamination_query"):
        return [str(templates.render(task.spec["doc_to_decontamination_query"], d)) for d in docs]
    if mode == "question":
        return [templates.doc_to_text(task, d) for d in docs]
    gold_t = task.spec.get("doc_to_gold")
    out = []
    for d in docs:
        ans = str(templates.render(gold_t, d)) if gold_t and task.output_type == tasks.GEN else templates.answer_text(task, d)
        out.append(templates.doc_to_text(task, d) + " " + ans)
    return out


@step("evaluate-contamination", EvaluateContaminationJob, order=160)
def run(conf: EvaluateContaminationJob, ctx: Run) -> dict:
    from cptkit.eval import (  # deferred: the eval task modules (~30 ms on --help)
        runner,
        task_data,
        tasks,
        templates,
    )
    from cptkit.eval.contamination import (  # deferred: numpy
        REPORT,
        BenchmarkIndex,
        contamination_report,
        ngram_hashes,
    )
    from cptkit.eval.tasks import task_dir  # deferred: the eval task modules (~30 ms on --help)

    ec = conf.eval
    if not ec.tasks:
        raise CptkitError("no benchmarks given: pass eval.tasks=[name,...] (conf/eval/tasks/*.yaml)")
    n = ec.ngram
    indexes = {}
    ids: dict[str, list[str]] = {}
    for name in ec.tasks:
        t = tasks.load_task(name, task_dir(ec), ec.data_dir)
        with templates.naming_file(t):
            indexes[t.name] = BenchmarkIndex.build(t.name, item_texts(t, ec.limit, ec.item_text), n)
        docs = task_data.load_docs(t, t.spec["test_split"])[: ec.limit or None]
        ids[t.name] = [runner.item_id(t, d, i) for i, d in enumerate(docs)]
    with Job(ctx) as job:
        for task in job.pending():
            t0 = time.time()
            docs = 0
            docs_hit = dict.fromkeys(indexes, 0)
            items_hit: dict[str, set[int]] = {k: set() for k in indexes}
            w = job.writer(task) if ec.action != "none" else None
            try:
                for rec in job.read(task):
                    docs += 1
                    h = ngram_hashes(rec["text"], n)
                    hit = []
                    for name, ix in indexes.items():
                        found = ix.match(h)
                        if found:
                            hit.append(name)
                            docs_hit[name] += 1
                            items_hit[name] |= found
                    if ec.action == "flag":
                        w.write({**rec, ec.flag_field: hit})
                    elif ec.action == "drop" and not hit:
                        w.write(rec)
            finally:
                if w is not None:
                    w.close()
            job.complete(task, w, seconds=time.time() - t0, docs=docs, docs_hit=docs_hit,
                         items_hit={k: sorted(v) for k, v in items_hit.items()})
        results = job.all_results()
        extra: dict = {}
        if len(results) == len(job.tasks) and not job.is_finished:
            total = sum(r["extra"]["docs"] for r in results.values())
            dh = {k: sum(r["extra"]["docs_hit"].get(k, 0) for r in results.values()) for k in indexes}
            ih = {k: set().union(*(r["extra"]["items_hit"].get(k, []) for r in results.values())) for k in indexes}
            report = contamination_report(total, dh, ih, indexes, ids)
            job.write_json(REPORT, {"ngram": n, "action": ec.action, "item_text": ec.item_text,
                                    "benchmarks": report})
            print_report(report, quiet=job.quiet)
            for k, v in report.items():
                extra[f"{k} docs %"] = 100 * v["docs_share"]
                extra[f"{k} items %"] = 100 * v["test_items_share"]
        return job.finish(extra=extra)


def print_report(report: dict, quiet: bool = False) -> None:
    if quiet:
        return
    t = Table(title="contamination (n-gram overlap)", header_style="bold")
    for c in ("benchmark", "n", "docs hit", "docs %", "test items hit", "items %"):
        t.add_column(c, justify="left" if c == "benchmark" else "right")
    for k, v in report.items():
        t.add_row(k, str(v["ngram"]), f"{v['docs_contaminated']:,}/{v['docs']:,}", f"{100 * v['docs_share']:.3f}",
                  f"{v['test_items_hit']}/{v['test_items']}", f"{100 * v['test_items_share']:.2f}")
    console.print(t)
