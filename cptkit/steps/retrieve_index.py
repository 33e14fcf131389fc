"""retrieve-index: build BM25 index shards (shard.index=I shard.count=N per array job, or
retrieve.shards=N); retrieve --index DIR then searches all shards with global statistics
(docs/retrieve.md, "Sharded mode").

``cptkit retrieve-index --corpus corpus/ --out idx/ shard.index=I shard.count=N`` builds
``idx/shard-IIIII-of-NNNNN/`` from the corpus files ``f`` with ``f % N == I`` — one job of a
SLURM array per shard, or all shards in one process with ``shard.count=1 retrieve.shards=N``.
Shards keep their own statistics; ``cptkit retrieve --index idx/`` merges them (global df,
N, avgdl) before scoring, so results equal one index over the whole corpus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from cptkit.core import remote
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.records import Record
from cptkit.core.run import Run
from cptkit.core.step import OUT, QUIET, SKIP_BAD, step
from cptkit.index.base import bm25_params, bm25_tokenizer
from cptkit.index.sharded import shard_dir, shard_files
from cptkit.index.store import build_index
from cptkit.steps.retrieve import CORPUS, RetrieveJob


@step("retrieve-index", RetrieveJob, options=(CORPUS, OUT, QUIET, SKIP_BAD), order=30)
def run(conf: RetrieveJob, ctx: Run) -> dict:
    """Build this slice's index shards (resumable: finished shards are kept)."""
    rc = conf.retrieve
    if not conf.io.inputs:
        raise CptkitError("no corpus given: pass --corpus DIR (files, directories or globs)")
    corpus = ctx.resolve_inputs()
    n_shards = rc.shards or conf.shard.count  # both validated: shards >= 0, shard.count >= 1
    if n_shards > len(corpus):
        raise CptkitError(f"{len(corpus)} corpus file(s) cannot make {n_shards} index shards; "
                          "split the corpus into more files or use fewer shards")
    tokenizer, params = bm25_tokenizer(rc), bm25_params(rc)
    position = {f.path: i for i, f in enumerate(corpus)}
    tasks = [Task(i, [corpus[f] for f in shard_files(len(corpus), i, n_shards)]) for i in range(n_shards)]
    with Job(ctx, inputs=corpus, tasks=tasks) as job:
        built = []
        for task in job.pending():
            t0 = time.time()
            sources = [{"path": f.path if remote.is_url(f.path) else str(Path(f.path).resolve()), "size": f.size, "file_index": position[f.path],
                        "docs": 0} for f in task.inputs]

            def records(task: Task = task, sources: list[dict] = sources) -> Iterator[Record]:
                for src, inp in zip(sources, task.inputs, strict=True):
                    for rec in job.read(Task(task.index, [inp]), plain_ids=True):  # ids go to _run.tsv
                        src["docs"] += 1
                        yield rec

            out = shard_dir(job.out, task.index, n_shards)
            meta = build_index(records(), out, tokenizer, params, dtype=rc.dtype, text_field=rc.text_field,
                               sources=sources, extra={"shard": {"index": task.index, "count": n_shards,
                                                                 "files": len(corpus)}})
            built.append(meta)
            job.complete(task, seconds=time.time() - t0, docs=meta["docs"], postings=meta["postings"])
        results = job.all_results()
        return job.finish(extra={
            "shards": n_shards,
            "shards built here": len(built),
            "shards finished": len(results),
            "docs (finished shards)": sum(r.get("extra", {}).get("docs", 0) for r in results.values()),
            "postings (finished shards)": sum(r.get("extra", {}).get("postings", 0) for r in results.values()),
            "index dir": job.output.name,
        })
