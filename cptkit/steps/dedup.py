"""dedup: remove exact and MinHash-LSH near-duplicates across all input shards (SPEC §3).

Three resumable phases (docs/dedup.md):

1. **Signatures**, one task per group of input files (``shard.task_bytes``; a big file is a task of
   its own): MinHash signatures (``uint32``) and a 128-bit hash of the normalised text, cached as
   ``OUT/.cptkit/sig-TTTTT.npy`` (+ ``exact-``, ``ids-``) and skipped on a rerun; the task's records
   as the writer serialises them go to ``lines-TTTTT.jsonl.zst`` (zstd level 1), so phase 3 neither
   decompresses nor parses the input again. With ``shard.count > 1`` each process computes its
   slice (map).
2. **Clustering**, global (reduce): exact duplicates first (equal text hashes), then LSH banding
   over the remaining documents, verification of every candidate pair (exact Jaccard of the
   shingle sets by default), union-find keeping the first document by input order. Cached as
   ``OUT/.cptkit/clusters.npz``.
3. **Writing**, one task per group of input files: the kept documents (lines copied from
   ``lines-TTTTT``, all deleted once every shard is written, as another array member may still be
   clustering from them; the input is read again when one is missing); then ``OUT/_removed.jsonl``
   lists every removed id with ``duplicate_of`` (the kept id), ``kind`` (exact|near), ``similarity``.

``dedup.workers=N`` runs the per-shard work of phases 1 and 3 (and the verification re-read) in N
forked processes (the frame's worker pool, :meth:`cptkit.core.job.Job.in_workers`); the output is
byte-identical to one process. The pipeline lives in :mod:`cptkit.dedup.cluster`, its config in
:mod:`cptkit.dedup.config`; this module declares the step and its phases, and wires them.

Memory holds the signatures (``num_perm * 4`` bytes per document), not the texts.

``dedup.cluster=mapreduce|redis`` replaces phase 2 by a bucket map/reduce that never holds all
signatures (:mod:`cptkit.dedup.scale`): map per shard, reduce per partition, then verification and
union-find over the candidate pairs; ``dedup.phase=map|reduce|final`` runs one phase (job arrays).
The output is identical to the in-memory clustering. The step declares its phases
(:func:`phases`): ``executor=ray|slurm`` and ``executor.workers=N`` run them as waves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from cptkit.core.config import JobConfig
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job
from cptkit.core.progress import log
from cptkit.core.run import Run
from cptkit.core.shards import STDIO
from cptkit.core.step import Phase, step
from cptkit.dedup import cluster as dc
from cptkit.dedup import minhash as mh
from cptkit.dedup import scale
from cptkit.dedup.cluster import describe
from cptkit.dedup.config import DedupConfig, banding


@dataclass
class DedupJob(JobConfig):
    dedup: DedupConfig = field(default_factory=DedupConfig)


def _recorded(ctx: Run, d: DedupConfig) -> Run:
    """What the Job records: every phase of one run shares its hash (``dedup.phase`` is reset), so
    does every ``dedup.workers`` (the output is the same), and a password in ``dedup.redis_url`` is
    masked."""
    return (ctx.recording("dedup.phase", "all").recording("dedup.workers", 1)
            .recording("dedup.redis_url", scale.mask_url(d.redis_url)))


def _not_ready(job: Job, phase: str, what: str, missing: list, next_phase: str, extra: dict[str, Any]) -> dict[str, Any]:
    """An earlier phase is unfinished: ``phase=all`` stops quietly (other slices are still at
    work), an explicit phase is an error."""
    if phase != "all":
        raise CptkitError(f"dedup.phase={phase}: {what} of {len(missing)} items is unfinished (first: "
                          f"{missing[0]}); run dedup.phase={next_phase} for every shard.index first")
    log.info("this slice is done; %s of %d items is unfinished (other slices): rerun once every slice "
             "has finished it", what, len(missing))
    return job.finish(extra=extra)


def phases(cfg: DictConfig) -> list[Phase]:
    """The waves of a scaled-out run: every slice's map, then (with a scale-out backend) every
    slice's reduce, then the final phase, slice 0 first (it computes the clustering once, the
    others reuse it)."""
    plan = [Phase("map", {"dedup.phase": "map"})]
    if str(cfg.dedup.cluster) != "memory":
        plan.append(Phase("reduce", {"dedup.phase": "reduce"}))
    return [*plan, Phase("final", {"dedup.phase": "final"}, leader=True)]


def _clustering(job: Job, conf: DedupJob, store: dc.Store, sh: mh.Shingler, backend: scale.Backend | None,
                info: dict[str, Any]) -> dc.DedupResult | dict[str, Any]:
    """Run this slice's map (and reduce); the clustering, or what :meth:`Job.finish` returned when
    this phase ends here (an explicit phase, or an earlier phase other slices have not finished)."""
    d, skip, phase = conf.dedup, conf.io.skip_bad_lines, conf.dedup.phase
    bands, rows = banding(d)
    if phase in ("all", "map"):
        dc.phase_signatures(job, store, sh, d, skip)
        if backend is not None:
            backend.map(store, bands, rows)
    if phase == "map":
        return job.finish(extra={"phase": "map"} | info)
    if backend is None:
        missing = [t.name for t in job.tasks if not store.has(t)]
        if missing:
            return _not_ready(job, phase, "the signatures (map)", missing, "map", {"phase": "signatures"} | info)
        return dc.load_or_cluster(job, store, conf.io, lambda: dc.phase_cluster(job, store, sh, d, skip, bands, rows))
    missing = backend.missing_maps()
    if missing:
        return _not_ready(job, phase, "the map", missing, "map", {"phase": "map"} | info)
    if phase in ("all", "reduce"):
        backend.reduce()
    if phase == "reduce":
        return job.finish(extra={"phase": "reduce"} | info)
    missing = backend.missing_reduces()
    if missing:
        return _not_ready(job, phase, "the reduce", [f"p-{p:04d}" for p in missing], "reduce",
                          {"phase": "reduce"} | info)
    return dc.load_or_cluster(job, store, conf.io,
                              lambda: dc.phase_cluster_scaled(job, store, sh, d, skip, backend))


def _write(job: Job, d: DedupConfig, store: dc.Store, backend: scale.Backend | None,
           res: dc.DedupResult) -> None:
    """The final phase: this slice's kept records, then (once every task is done) ``_removed.jsonl``."""
    workers = 1 if job.stdout else d.workers
    for task, done in job.in_workers(job.pending(), lambda t: dc.write_task(job, store, res, t), workers):
        job.complete(task, result=done)
    if job.stdout:
        log.info("--out -: the list of removed ids (_removed.jsonl) is not written")
    elif all(job.is_done(t) for t in job.tasks):
        # the lines caches go only now: another member of a job array may still be clustering from them
        for task in job.tasks:
            store.drop_lines(task)
        dc.write_removed(job, store, res)
        if backend is not None and d.cleanup:
            backend.cleanup()


@step("dedup", DedupJob, order=50, phases=phases)
def run(conf: DedupJob, ctx: Run) -> dict[str, Any]:
    """Remove exact and near duplicates; keep the first document of every cluster."""
    d = conf.dedup
    bands, rows = banding(d)
    info = describe(d, bands, rows)
    with Job(_recorded(ctx, d), independent_tasks=False) as job:
        if any(f.path == STDIO for f in job.inputs):
            raise CptkitError("dedup reads its input several times: --in - (stdin) is not supported, "
                              "pass files")
        if job.is_finished:
            return job.finish()
        sh = mh.Shingler(d.ngram, d.num_perm, d.seed, d.tokenizer, d.lowercase)
        store = dc.Store(job)
        backend = scale.make_backend(job, d, bands)
        if d.cluster != "memory":
            info = info | {"cluster": f"{d.cluster}, {backend.partitions} partitions"}
        res = _clustering(job, conf, store, sh, backend, info)
        if not isinstance(res, dc.DedupResult):
            return res  # this phase ends here
        _write(job, d, store, backend, res)
        return job.finish(extra=res.counts.rows() | info)
