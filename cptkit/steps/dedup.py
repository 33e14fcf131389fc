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
forked processes; the output is byte-identical to one process.

Memory holds the signatures (``num_perm * 4`` bytes per document), not the texts.

``dedup.cluster=mapreduce|redis`` replaces phase 2 by a bucket map/reduce that never holds all
signatures (:mod:`cptkit.dedup.scale`): map per shard, reduce per partition, then verification and
union-find over the candidate pairs; ``dedup.phase=map|reduce|final`` runs one phase (job arrays).
The output is identical to the in-memory clustering.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from cptkit.core.config import IOConfig, JobConfig, check
from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.job import STATE_DIR, Job, Task, TaskResult
from cptkit.core.progress import log
from cptkit.core.records import dumps
from cptkit.core.run import Run
from cptkit.core.shards import (
    STDIO,
    ReadStats,
    atomic_write_bytes,
    open_binary,
    open_new,
    read_records,
    tmp_name,
)
from cptkit.core.step import step
from cptkit.dedup import minhash as mh
from cptkit.dedup import scale

KEPT, EXACT, NEAR = 0, 1, 2
KINDS = {EXACT: "exact", NEAR: "near"}
VERIFY = ("exact", "estimate", "none")


@dataclass
class DedupConfig:
    """Shingling, MinHash and LSH settings (recorded in the manifest's ``extra``)."""

    ngram: int = 13  # words per shingle; shorter documents are one shingle
    threshold: float = 0.8  # Jaccard at or above which two documents are duplicates
    num_perm: int = 128  # MinHash permutations (signature length)
    bands: int | None = None  # LSH bands; null: from target_recall (lsh_params)
    rows: int | None = None  # rows per band; null: from target_recall
    target_recall: float = 0.95  # P(candidate | J = threshold) the computed banding must reach
    seed: int = 42  # word hashing, permutations and band keys
    tokenizer: str = "words"  # words (\w runs, CJK chars one by one) | whitespace
    lowercase: bool = True
    exact: bool = True  # remove exact duplicates (hash of normalised text) first
    verify: str = "exact"  # exact (Jaccard of shingle sets) | estimate (signatures) | none
    bucket_all_pairs_max: int = 16  # bigger buckets give a star + chain of pairs, not all pairs
    batch_docs: int = 4096  # documents per signature batch
    cluster: str = "memory"  # memory (all signatures on one node) | mapreduce (bucket files) | redis
    phase: str = "all"  # all | map | reduce | final: run one phase (job arrays); not part of the run's identity
    partitions: int = 16  # mapreduce/redis: bucket partitions, the reduce tasks
    redis_url: str = "redis://127.0.0.1:6379/0"  # cluster=redis
    redis_namespace: str | None = None  # key prefix; null: cptkit:dedup:<hash of config, output, inputs>
    redis_batch: int = 4096  # bucket entries per pipelined Redis script call
    cleanup: bool = True  # mapreduce/redis: drop the bucket files / Redis keys once the output is complete
    workers: int = 1  # processes for the per-shard phases (signatures, verification re-read, writing); 0: one per CPU

    def __post_init__(self) -> None:
        check_config(self)
        banding(self)


@dataclass
class DedupJob(JobConfig):
    dedup: DedupConfig = field(default_factory=DedupConfig)


def banding(d: DedupConfig) -> tuple[int, int]:
    """The ``(bands, rows)`` of a config: given, half given (the other fills num_perm), or computed."""
    num_perm, bands, rows = d.num_perm, d.bands, d.rows
    if bands is None and rows is None:
        check(0.0 < d.target_recall < 1.0, "target_recall", d.target_recall, "must be in (0, 1)")
        try:
            return mh.lsh_params(d.threshold, num_perm, d.target_recall)
        except ValueError as e:
            check(False, "target_recall", d.target_recall, str(e))
    key, value = ("bands", bands) if bands is not None else ("rows", rows)
    bands = bands if bands is not None else num_perm // rows  # type: ignore[operator]
    rows = rows if rows is not None else num_perm // bands
    check(bands >= 1 and rows >= 1 and bands * rows <= num_perm, key, value,
          f"bands x rows = {bands} x {rows} must be >= 1 each and use at most num_perm={num_perm} permutations")
    return bands, rows


def check_config(d: DedupConfig) -> None:
    check(d.ngram >= 1, "ngram", d.ngram, "must be >= 1")
    check(0.0 < d.threshold <= 1.0, "threshold", d.threshold, "must be in (0, 1]")
    check(d.num_perm >= 1, "num_perm", d.num_perm, "must be >= 1")
    check(d.verify in VERIFY, "verify", d.verify, f"must be one of {', '.join(VERIFY)}")
    check(d.tokenizer in mh.TOKEN_PATTERNS, "tokenizer", d.tokenizer, f"must be one of {', '.join(mh.TOKEN_PATTERNS)}")
    check(d.batch_docs >= 1, "batch_docs", d.batch_docs, "must be >= 1")
    check(d.cluster in scale.CLUSTER, "cluster", d.cluster, f"must be one of {', '.join(scale.CLUSTER)}")
    check(d.phase in scale.PHASES, "phase", d.phase, f"must be one of {', '.join(scale.PHASES)}")
    check(not (d.phase == "reduce" and d.cluster == "memory"), "phase", d.phase,
          "needs dedup.cluster=mapreduce or redis (memory has map and final)")
    check(1 <= d.partitions <= 9999, "partitions", d.partitions, "must be in [1, 9999]")
    check(d.redis_batch >= 1, "redis_batch", d.redis_batch, "must be >= 1")
    check(d.workers >= 0, "workers", d.workers, "must be >= 0 (0: one per CPU)")


def describe(d: DedupConfig, bands: int, rows: int) -> dict:
    """Shingling, hashing and banding for the manifest's ``extra`` (to compare counts across tools)."""
    n, seed, t = d.ngram, d.seed, d.threshold
    tok = {"words": "runs of word characters, each CJK/kana/hangul character alone",
           "whitespace": "whitespace-separated"}[d.tokenizer]
    return {
        "shingling": f"{d.tokenizer} tokens ({tok}){', lower-cased' if d.lowercase else ''}; "
                     f"word {n}-grams; a document of fewer than {n} words is one shingle",
        "hashing": f"word FNV-1a 64 of utf-8 from basis^{seed}, murmur3 fmix64; shingle sum_k h(w_k)*M^(n-1-k) mod 2^64; "
                   f"{d.num_perm} permutations ((a*x+b) mod 2^64)>>32 of x = shingle>>32, "
                   f"a|1, b uint64 from numpy PCG64({seed}); uint32 signatures",
        "exact": "xxh3_128 of lower-cased text, whitespace collapsed" if d.exact else "off",
        "bands": bands,
        "rows": rows,
        "p_candidate_at_threshold": round(mh.collision_probability(t, bands, rows), 4),
        "verify": f"{d.verify}: " + {"exact": f"Jaccard of 64-bit shingle-hash sets >= {t}",
                                     "estimate": f"share of equal signature values >= {t}",
                                     "none": "every candidate pair is a duplicate"}[d.verify],
    }


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


# -- per-shard work in forked processes (dedup.workers) -----------------------------------------
_WORK: tuple[Callable, list[Task]] | None = None  # what a forked worker runs; set before the fork


def _n_workers(workers: int, tasks: int) -> int:
    """Processes for ``tasks`` tasks with ``dedup.workers=workers`` (0: one per CPU)."""
    return max(1, min(workers or os.cpu_count() or 1, tasks))


class _Failed:
    """A worker's cptkit error, as a value (``BadInput`` itself does not unpickle)."""

    def __init__(self, e: CptkitError):
        self.args = (e.path, e.line, e.reason) if isinstance(e, BadInput) else (str(e),)

    def error(self) -> CptkitError:
        return BadInput(*self.args) if len(self.args) == 3 else CptkitError(*self.args)


def _forked(k: int) -> tuple[int, object]:
    """In a worker: run task ``k``."""
    fn, tasks = _WORK  # type: ignore[misc]
    try:
        return k, fn(tasks[k])
    except CptkitError as e:
        return k, _Failed(e)


def in_workers(workers: int, tasks: list[Task], fn: Callable[[Task], object],
               init: Callable[[], None] | None = None) -> Iterator[tuple[Task, object]]:
    """``(task, fn(task))`` for every task: in this process, in order, with one worker; else in up to
    ``workers`` forked processes (0: one per CPU), in completion order, each running ``init()`` first.
    ``fn`` sees this process's state as of the fork and returns a picklable value."""
    global _WORK
    n = _n_workers(workers, len(tasks))
    if n <= 1:
        for task in tasks:
            yield task, fn(task)
        return
    _WORK = (fn, tasks)
    try:
        with mp.get_context("fork").Pool(n, initializer=init) as pool:
            for k, out in pool.imap_unordered(_forked, range(len(tasks))):
                if isinstance(out, _Failed):
                    raise out.error()
                yield tasks[k], out
    finally:
        _WORK = None


class _Store:
    """Phase-1 results per task: files under ``OUT/.cptkit`` (or memory when writing to stdout)."""

    def __init__(self, job: Job):
        self.dir = None if job.stdout else job.out / STATE_DIR
        self.mem: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {}

    def has(self, task: Task) -> bool:
        return task.name in self.mem if self.dir is None else (self.dir / f"sig-{task.name}.npy").exists()

    def put(self, task: Task, sig: np.ndarray, exact: np.ndarray, ids: list[str]) -> None:
        if self.dir is None:
            self.mem[task.name] = (sig, exact, ids)
            return
        atomic_write_bytes(self.dir / f"ids-{task.name}.json", json.dumps(ids, ensure_ascii=False).encode())
        atomic_write_bytes(self.dir / f"exact-{task.name}.npy", _npy_bytes(exact))
        atomic_write_bytes(self.dir / f"sig-{task.name}.npy", _npy_bytes(sig))  # last: marks done

    def sig(self, task: Task) -> np.ndarray:
        return self.mem[task.name][0] if self.dir is None else np.load(self.dir / f"sig-{task.name}.npy")

    def exact(self, task: Task) -> np.ndarray:
        return self.mem[task.name][1] if self.dir is None else np.load(self.dir / f"exact-{task.name}.npy")

    def sig_rows(self, task: Task, rows: np.ndarray) -> np.ndarray:
        """Some rows of a task's signatures, without loading the others (memory-mapped)."""
        if self.dir is None:
            return self.mem[task.name][0][rows]
        return np.asarray(np.load(self.dir / f"sig-{task.name}.npy", mmap_mode="r")[rows])

    def ids(self, task: Task) -> list[str]:
        if self.dir is None:
            return self.mem[task.name][2]
        return json.loads((self.dir / f"ids-{task.name}.json").read_text(encoding="utf-8"))

    # The task's valid records as the writer serialises them (records.dumps), one per line, zstd
    # level 1: phase 3 copies the kept lines instead of decompressing and parsing the input again.
    def lines_path(self, task: Task) -> Path:
        return self.dir / f"lines-{task.name}.jsonl.zst"  # type: ignore[operator]

    def lines_writer(self, task: Task) -> _LinesWriter | None:
        return None if self.dir is None else _LinesWriter(self.lines_path(task))

    def lines(self, task: Task) -> tuple[Path, int] | None:
        """(the lines file, records the task's inputs had skipped as bad), or None: read the inputs."""
        if self.dir is None:
            return None
        meta = self.dir / f"lines-{task.name}.json"
        if not meta.exists() or not self.lines_path(task).exists():
            return None
        return self.lines_path(task), int(json.loads(meta.read_text())["bad"])

    def drop_lines(self, task: Task) -> None:
        if self.dir is not None:
            self.lines_path(task).unlink(missing_ok=True)
            (self.dir / f"lines-{task.name}.json").unlink(missing_ok=True)


class _LinesWriter:
    """Streams serialised records into ``lines-TTTTT.jsonl.zst`` (temporary name until ``close``)."""

    def __init__(self, path: Path):
        import zstandard

        self.path, self.tmp = path, tmp_name(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.raw = open_new(self.tmp)
        self.z = zstandard.ZstdCompressor(level=1).stream_writer(self.raw, closefd=False)
        self.buf: list[str] = []

    def add(self, line: str) -> None:
        self.buf.append(line)
        if len(self.buf) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.z.write(("\n".join(self.buf) + "\n").encode("utf-8"))
            self.buf = []

    def close(self, bad: int) -> None:
        self.flush()
        self.z.close()
        self.raw.close()
        os.replace(self.tmp, self.path)
        atomic_write_bytes(self.path.with_name(self.path.name.replace(".jsonl.zst", ".json")),
                           json.dumps({"bad": bad}).encode())

    def abort(self) -> None:
        self.raw.close()
        self.tmp.unlink(missing_ok=True)


def _read_lines(path: Path) -> Iterator[bytes]:
    import zstandard

    with open(path, "rb") as f, io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(f)) as r:  # type: ignore[arg-type]
        yield from r


def _texts(job: Job, task: Task, skip_bad: bool):
    """(row, record) of a task's valid records, in the order every phase sees them."""
    row = 0
    for inp in task.inputs:
        for rec in read_records(inp, skip_bad=skip_bad, stats=ReadStats(), **job.ctx.io.limits()):
            yield row, rec
            row += 1


def _wanted_texts(task: Task, rows: set[int], max_chars: int = 0):
    """(row, text) of the given rows only, parsing no other line (texts cut to ``max_chars``: 0 keeps
    them whole). Valid when every non-blank line is a record (phase 1 read the shard without
    skipping bad lines or long texts)."""
    row = 0
    for inp in task.inputs:
        fh, _ = open_binary(inp.path)
        try:
            for raw in fh:
                if not raw.strip():
                    continue
                if row in rows:
                    text = json.loads(raw)["text"]
                    yield row, text[:max_chars] if max_chars else text
                row += 1
        finally:
            fh.close()


def _signature_task(job: Job, store: _Store, sh: mh.Shingler, d: DedupConfig, skip: bool, task: Task) -> None:
    """Phase 1 for one shard: its signatures, exact hashes and ids into ``store``."""
    batch = d.batch_docs
    sigs, exact, ids, texts = [], [], [], []
    lines = store.lines_writer(task)
    bad = 0
    try:
        for inp in task.inputs:
            st = ReadStats()
            for rec in read_records(inp, skip_bad=skip, stats=st, **job.ctx.io.limits()):
                ids.append(rec["id"])
                texts.append(rec["text"])
                exact.append(mh.exact_hash(rec["text"]))
                if lines is not None:
                    lines.add(dumps(rec))
                if len(texts) >= batch:
                    sigs.append(sh.signatures(texts))
                    texts = []
            bad += st.bad
        if texts:
            sigs.append(sh.signatures(texts))
        if lines is not None:
            lines.close(bad)
    except BaseException:
        if lines is not None:
            lines.abort()
        raise
    sig = np.concatenate(sigs) if sigs else np.empty((0, sh.num_perm), dtype=np.uint32)
    store.put(task, sig, np.array(exact, dtype=np.uint64).reshape(-1, 2), ids)


def phase_signatures(job: Job, store: _Store, sh: mh.Shingler, d: DedupConfig, skip: bool) -> None:
    """Phase 1: signatures and exact hashes of this slice's shards that have none yet."""
    todo = [t for t in job.mine() if not store.has(t)]
    if not todo:
        return
    advance = job.add_bar("signatures", sum(f.size for t in todo for f in t.inputs) or None)
    workers = 1 if store.dir is None else d.workers  # (to stdout the signatures stay in this process)
    if _n_workers(workers, len(todo)) > 1:
        sh.signatures(["warm"])  # load the compiled kernels once, before the fork
    for task, _ in in_workers(workers, todo, lambda t: _signature_task(job, store, sh, d, skip, t)):
        advance(sum(f.size for f in task.inputs))


def _shingle_sets(job: Job, sh: mh.Shingler, offsets: np.ndarray, docs: np.ndarray,
                  skip: bool, workers: int = 1, store: _Store | None = None) -> dict[int, np.ndarray]:
    """Phase 2 helper: re-read the candidate documents ``docs`` (global indices) and shingle them."""
    io_cfg = job.ctx.io
    skip = skip or io_cfg.oversize == "skip"  # rows are counted over valid records only
    cut = io_cfg.max_record_chars if io_cfg.oversize == "truncate" else 0
    owner = np.searchsorted(offsets, docs, side="right") - 1

    def shard_sets(task: Task) -> tuple[list[int], list[np.ndarray]]:
        base = int(offsets[task.index])
        mine = docs[owner == task.index].tolist()
        idx, texts = [], []
        cached = store.lines(task) if store is not None else None
        if cached is not None:  # phase 1's serialised records: valid records only, no gzip
            rows = {g - base for g in mine}
            for row, line in enumerate(_read_lines(cached[0])):
                if row in rows:
                    idx.append(base + row)
                    texts.append(json.loads(line)["text"])
        elif skip:
            want = set(mine)
            for row, rec in _texts(job, task, skip):
                if base + row in want:
                    idx.append(base + row)
                    texts.append(rec["text"])
        else:
            for row, text in _wanted_texts(task, {g - base for g in mine}, cut):
                idx.append(base + row)
                texts.append(text)
        return idx, sh.shingle_sets(texts)

    sets: dict[int, np.ndarray] = {}
    advance = job.add_bar("verify: re-read candidates", len(docs))
    tasks = [job.tasks[t] for t in np.unique(owner).tolist()]
    for _, (idx, shard) in in_workers(workers, tasks, shard_sets):  # type: ignore[misc]
        sets.update(zip(idx, shard, strict=True))
        advance(len(idx))
    return sets


def phase_cluster(job: Job, store: _Store, sh: mh.Shingler, d: DedupConfig, skip: bool, bands: int,
                  rows: int) -> dict:
    """Phase 2 in memory: exact duplicates and LSH candidates over all signatures, then clusters."""
    sigs = [store.sig(t) for t in job.tasks]
    offsets = np.zeros(len(sigs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sigs], out=offsets[1:])
    n = int(offsets[-1])
    sig = np.concatenate(sigs) if sigs else np.empty((0, d.num_perm), dtype=np.uint32)
    del sigs
    if d.exact and n:
        exact_first = mh.first_occurrence(np.concatenate([store.exact(t) for t in job.tasks]))
    else:
        exact_first = np.arange(n, dtype=np.int64)
    uniq = np.flatnonzero(exact_first == np.arange(n))
    keys = mh.band_keys(sig[uniq], bands, rows, d.seed)
    pairs = mh.candidate_pairs(keys, uniq, d.bucket_all_pairs_max)
    del keys
    return cluster_candidates(job, sh, d, skip, offsets, exact_first, pairs, lambda docs: sig[docs], store)


def phase_cluster_scaled(job: Job, store: _Store, sh: mh.Shingler, d: DedupConfig, skip: bool,
                         backend: scale.Backend) -> dict:
    """Phase 2 after a bucket map/reduce: candidates from the partitions' pair files, then clusters.

    Only the signature rows of candidate documents are read (``verify=estimate``)."""
    offsets, exact_first, pairs = scale.candidates(backend)

    def sig_rows(docs: np.ndarray) -> np.ndarray:
        owner = np.searchsorted(offsets, docs, side="right") - 1
        parts = [store.sig_rows(job.tasks[t], docs[owner == t] - offsets[t]) for t in np.unique(owner).tolist()]
        return np.concatenate(parts) if parts else np.empty((0, d.num_perm), dtype=np.uint32)

    return cluster_candidates(job, sh, d, skip, offsets, exact_first, pairs, sig_rows, store)


def cluster_candidates(job: Job, sh: mh.Shingler, d: DedupConfig, skip: bool, offsets: np.ndarray,
                       exact_first: np.ndarray, pairs: np.ndarray, sig_rows, store: _Store | None = None) -> dict:
    """Verify candidate ``pairs`` (global indices), union-find them, attach exact duplicates.

    ``sig_rows(docs)`` returns the signatures of the sorted documents ``docs`` (``verify=estimate``)."""
    n = int(offsets[-1])
    threshold = d.threshold
    docs = np.unique(pairs)
    sets: dict[int, np.ndarray] = {}
    if d.verify == "exact" and len(pairs):
        sets = _shingle_sets(job, sh, offsets, docs, skip, d.workers, store)

        def sim_of(p: np.ndarray) -> np.ndarray:
            return np.array([mh.jaccard_sorted(sets[i], sets[j]) for i, j in p.tolist()], dtype=np.float64)
    else:
        sub = sig_rows(docs)

        def sim_of(p: np.ndarray) -> np.ndarray:
            return mh.estimated_jaccard(sub, np.searchsorted(docs, p)) if len(p) else np.empty(0)
    sim = sim_of(pairs)
    ok = sim >= threshold if d.verify != "none" else np.ones(len(pairs), dtype=bool)
    verified = pairs[ok]
    near_root = mh.union_find_roots(n, verified)
    root = near_root[exact_first]
    kind = np.full(n, KEPT, dtype=np.int8)
    removed = np.flatnonzero(root != np.arange(n))
    kind[removed] = np.where(exact_first[removed] != removed, EXACT, NEAR)
    # similarity of each removed document (exact: of its exact original) to the kept document
    similarity = np.ones(n, dtype=np.float32)
    src = exact_first[removed]
    need = src != root[removed]
    a, b = src[need], root[removed][need]
    similarity[removed[need]] = sim_of(np.stack([a, b], axis=1))
    counts = {
        "docs in": n,
        "docs out": int(n - len(removed)),
        "exact duplicates": int((kind == EXACT).sum()),
        "near duplicates": int((kind == NEAR).sum()),
        "duplicate clusters": int(len(np.unique(root[removed]))),
        "candidate pairs": int(len(pairs)),
        "verified pairs": int(len(verified)),
    }
    return {"offsets": offsets, "root": root, "kind": kind, "similarity": similarity, "counts": counts}


def check_unique_ids(job: Job, store: _Store, io_cfg: IOConfig) -> None:
    """Every input id must be unique, or ``duplicate_of`` would name an ambiguous document:
    the second occurrence (in input order) is an error naming both places."""
    if not io_cfg.unique_ids:
        return
    parts = [store.ids(t) for t in job.tasks]
    h = np.concatenate([np.fromiter((hash(i) for i in ids), np.int64, len(ids)) for ids in parts] or [np.zeros(0, np.int64)])
    order = np.argsort(h, kind="stable")
    same = np.flatnonzero(h[order][1:] == h[order][:-1])
    if not same.size:
        return
    offsets = np.cumsum([0] + [len(ids) for ids in parts])

    def where(g: int) -> tuple[int, int]:
        t = int(np.searchsorted(offsets, g, side="right") - 1)
        return t, g - int(offsets[t])

    for k in np.argsort(order[same + 1], kind="stable").tolist():
        first, second = int(order[same[k]]), int(order[same[k] + 1])
        (t1, r1), (t2, r2) = where(first), where(second)
        if parts[t1][r1] != parts[t2][r2]:
            continue  # a hash collision, not a duplicate
        f1, l1 = _line_of(job.tasks[t1], r1, io_cfg)
        f2, l2 = _line_of(job.tasks[t2], r2, io_cfg)
        raise BadInput(f2, l2, f"duplicate id {parts[t2][r2]!r} (first at {f1}:{l1}); ids must be unique, or "
                       "duplicate_of is ambiguous (io.unique_ids=false accepts them)")


def _line_of(task: Task, row: int, io_cfg: IOConfig) -> tuple[str, int]:
    """(file, line) of a task's ``row``-th valid record."""
    n = 0
    for inp in task.inputs:
        st = ReadStats()
        for _ in read_records(inp, skip_bad=io_cfg.skip_bad_lines, stats=st, **io_cfg.limits()):
            if n == row:
                return inp.name, st.line
            n += 1
    return task.inputs[-1].name, 0


def _load_or_cluster(job: Job, store: _Store, io_cfg: IOConfig, compute) -> dict:
    """The clustering, from ``OUT/.cptkit/clusters.npz`` or ``compute()`` (then cached there)."""
    path = None if job.stdout else job.out / STATE_DIR / "clusters.npz"
    if path is not None and path.exists():
        z = np.load(path)
        return {k: z[k] for k in ("offsets", "root", "kind", "similarity")} | {
            "counts": json.loads(str(z["counts"]))}
    check_unique_ids(job, store, io_cfg)
    res = compute()
    if path is not None:
        buf = io.BytesIO()
        np.savez(buf, offsets=res["offsets"], root=res["root"], kind=res["kind"], similarity=res["similarity"],
                 counts=np.array(json.dumps(res["counts"])))
        atomic_write_bytes(path, buf.getvalue())
    return res


def write_removed(job: Job, store: _Store, res: dict) -> None:
    """``OUT/_removed.jsonl``: one line per removed document, in input order."""
    offsets, root, kind, sim = res["offsets"], res["root"], res["kind"], res["similarity"]
    removed = np.flatnonzero(kind != KEPT)
    needed = np.union1d(removed, root[removed])
    ids: dict[int, str] = {}
    for t in np.unique(np.searchsorted(offsets, needed, side="right") - 1).tolist():
        base, shard_ids = int(offsets[t]), store.ids(job.tasks[t])
        lo, hi = np.searchsorted(needed, [base, int(offsets[t + 1])])
        for g in needed[lo:hi].tolist():
            ids[g] = shard_ids[g - base]
    lines = [dumps({"id": ids[i], "duplicate_of": ids[int(root[i])], "kind": KINDS[int(kind[i])],
                    "similarity": round(float(sim[i]), 4)}) + "\n" for i in removed.tolist()]
    atomic_write_bytes(job.out / "_removed.jsonl", "".join(lines).encode("utf-8"))


def _write_task(job: Job, store: _Store, res: dict, task: Task) -> dict:
    """Phase 3 for one shard: its kept records; what :meth:`Job.complete` records of it."""
    t0 = time.time()
    if not job.stdout:  # temporary shards of a killed run (the writer only clears finished ones)
        for stale in job.out.glob(f".part-{task.name}-*.tmp-*"):
            stale.unlink()
    root = res["root"]
    base = int(res["offsets"][task.index])
    removed = 0
    cached = store.lines(task)
    with job.writer(task) as w:
        if cached is None:
            for row, rec in enumerate(job.read(task)):
                if root[base + row] == base + row:
                    w.write(rec)
                else:
                    removed += 1
            r = job.results[task.name]
            records_in, bad = r.records_in, r.bad
        else:  # the records as phase 1 serialised them: the same bytes, no second parse
            path, bad = cached
            records_in = 0
            for row, line in enumerate(_read_lines(path)):
                if root[base + row] == base + row:
                    w.write_line(line[:-1].decode("utf-8"))
                else:
                    removed += 1
                records_in += 1
            job.advance_read(task)
    return {"records_in": records_in, "bad": bad, "records": w.records, "files": list(w.files),
            "removed": removed, "seconds": round(time.time() - t0, 3)}


def _recorded(ctx: Run, d: DedupConfig) -> Run:
    """What the Job records: every phase of one run shares its hash (``dedup.phase`` is reset), so
    does every ``dedup.workers`` (the output is the same), and a password in ``dedup.redis_url`` is
    masked."""
    return (ctx.recording("dedup.phase", "all").recording("dedup.workers", 1)
            .recording("dedup.redis_url", scale.mask_url(d.redis_url)))


def _not_ready(job: Job, phase: str, what: str, missing: list, next_phase: str, extra: dict) -> dict:
    """An earlier phase is unfinished: ``phase=all`` stops quietly (other slices are still at
    work), an explicit phase is an error."""
    if phase != "all":
        raise CptkitError(f"dedup.phase={phase}: {what} of {len(missing)} items is unfinished (first: "
                          f"{missing[0]}); run dedup.phase={next_phase} for every shard.index first")
    log.info("this slice is done; %s of %d items is unfinished (other slices): rerun once every slice "
             "has finished it", what, len(missing))
    return job.finish(extra=extra)


@step("dedup", DedupJob, order=50)
def run(conf: DedupJob, ctx: Run) -> dict:
    """Remove exact and near duplicates; keep the first document of every cluster."""
    d, skip = conf.dedup, conf.io.skip_bad_lines
    bands, rows = banding(d)
    info = describe(d, bands, rows)
    phase, cluster = d.phase, d.cluster
    with Job(_recorded(ctx, d), independent_tasks=False) as job:
        if any(f.path == STDIO for f in job.inputs):
            raise CptkitError("dedup reads its input several times: --in - (stdin) is not supported, "
                              "pass files")
        if job.already_done:
            return job.finish()
        sh = mh.Shingler(d.ngram, d.num_perm, d.seed, d.tokenizer, d.lowercase)
        store = _Store(job)
        backend = scale.make_backend(job, d, bands)
        if cluster != "memory":
            info = info | {"cluster": f"{cluster}, {backend.partitions} partitions"}
        if phase in ("all", "map"):
            phase_signatures(job, store, sh, d, skip)
            if backend is not None:
                backend.map(store, bands, rows)
        if phase == "map":
            return job.finish(extra={"phase": "map"} | info)
        if backend is None:
            missing = [t.name for t in job.tasks if not store.has(t)]
            if missing:
                return _not_ready(job, phase, "the signatures (map)", missing, "map",
                                  {"phase": "signatures"} | info)

            def compute() -> dict:
                return phase_cluster(job, store, sh, d, skip, bands, rows)
        else:
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

            def compute() -> dict:
                return phase_cluster_scaled(job, store, sh, d, skip, backend)
        res = _load_or_cluster(job, store, conf.io, compute)
        pending = job.pending()
        workers = 1 if job.stdout else d.workers
        for task, out in in_workers(workers, pending, lambda t: _write_task(job, store, res, t),
                                        init=job.detach_progress):
            r = job.results.setdefault(task.name, TaskResult())
            r.records_in, r.bad = out["records_in"], out["bad"]
            job.complete(task, SimpleNamespace(records=out["records"], files=out["files"]),
                         removed=out["removed"], seconds=out["seconds"])
        if job.stdout:
            log.info("--out -: the list of removed ids (_removed.jsonl) is not written")
        elif all(job.is_done(t) for t in job.tasks):
            # the lines caches go only now: another member of a job array may still be clustering from them
            for task in job.tasks:
                store.drop_lines(task)
            write_removed(job, store, res)
            if backend is not None and d.cleanup:
                backend.cleanup()
        counts = res["counts"]
        return job.finish(extra=counts | info)
