"""The dedup pipeline over a run's tasks (:mod:`cptkit.steps.dedup` wires it to files; docs/dedup.md).

1. **Signatures** (:func:`phase_signatures`), one task per group of input files: MinHash
   signatures (``uint32``) and a 128-bit hash of the normalised text, kept by :class:`Store` as
   ``OUT/.cptkit/sig-TTTTT.npy`` (+ ``exact-``, ``ids-``); the task's records as the writer
   serialises them go to ``lines-TTTTT-0000.jsonl.zst`` (a :class:`cptkit.core.shards.ShardWriter`,
   zstd level 1), so phase 3 neither decompresses nor parses the input again.
2. **Clustering** (:func:`phase_cluster`, or :func:`phase_cluster_scaled` after a bucket
   map/reduce, :mod:`cptkit.dedup.scale`): exact duplicates first, then LSH candidates, verified
   (:func:`cluster_candidates`), union-find keeping the first document by input order; cached as
   ``OUT/.cptkit/clusters.npz`` (:func:`load_or_cluster`).
3. **Writing** (:func:`write_task`, :func:`write_removed`): the kept records of each task, then
   ``OUT/_removed.jsonl``.

The per-task work of phases 1 and 3 and the verification re-read run in the frame's worker
processes (:meth:`cptkit.core.job.Job.in_workers`, ``dedup.workers``).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.config import IOConfig
from cptkit.core.errors import BadInput
from cptkit.core.job import SKIPPED, Job, Task, TaskResult
from cptkit.core.records import dumps
from cptkit.core.shards import ReadStats, ShardWriter, atomic_write_bytes, open_binary, read_records
from cptkit.core.warc import is_warc
from cptkit.core.workers import in_workers, n_workers
from cptkit.dedup import minhash as mh
from cptkit.dedup import scale
from cptkit.dedup.config import DedupConfig

KEPT, EXACT, NEAR = 0, 1, 2
KINDS = {EXACT: "exact", NEAR: "near"}


@dataclass(frozen=True)
class DedupCounts:
    """What the clustering found, over every input document."""

    docs_in: int
    docs_out: int
    exact_duplicates: int
    near_duplicates: int
    duplicate_clusters: int
    candidate_pairs: int
    verified_pairs: int

    def rows(self) -> dict[str, int]:
        """The manifest's ``extra`` and summary-table rows: ``{"docs in": ..., ...}`` in field order
        (also the form cached in ``clusters.npz``)."""
        return {f.name.replace("_", " "): getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of_rows(cls, rows: dict[str, int]) -> DedupCounts:
        """The counts of :meth:`rows`' form."""
        return cls(**{k.replace(" ", "_"): int(v) for k, v in rows.items()})


@dataclass(frozen=True)
class DedupResult:
    """The clustering (phase 2): per document, by global input index, what phase 3 keeps or removes."""

    offsets: np.ndarray  # each task's first global index, then the total (int64)
    root: np.ndarray  # the kept document of each document's cluster; itself when it is kept (int64)
    kind: np.ndarray  # KEPT | EXACT | NEAR (int8)
    similarity: np.ndarray  # of each removed document (exact: of its exact original) to its root (float32)
    counts: DedupCounts

    ARRAYS = ("offsets", "root", "kind", "similarity")  # the members cached in clusters.npz, beside counts


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



class Store:
    """Phase-1 results per task: files under ``OUT/.cptkit`` (or memory when writing to stdout)."""

    def __init__(self, job: Job):
        self.dir = None if job.stdout else job.state_dir
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
        return self.dir / f"lines-{task.name}-0000.jsonl.zst"  # type: ignore[operator]

    def lines_writer(self, task: Task) -> ShardWriter | None:
        """One shard, written as it is (no masking: phase 3's writer masks), or None (to stdout)."""
        if self.dir is None:
            return None
        return ShardWriter(self.dir, f"lines-{task.name}", compression="zst", max_bytes=0, zstd_level=1, mask=False)

    def lines(self, task: Task) -> tuple[Path, int, dict[str, int]] | None:
        """(the lines file, records the task's inputs had skipped as bad, archive records skipped by
        reason), or None: read the inputs."""
        if self.dir is None:
            return None
        meta = self.dir / f"lines-{task.name}.json"
        if not meta.exists() or not self.lines_path(task).exists():
            return None
        info = json.loads(meta.read_text())
        return self.lines_path(task), int(info["bad"]), info.get("skipped", {})

    def lines_done(self, task: Task, bad: int, skipped: dict[str, int] | None = None) -> None:
        """The task's lines are written: record how many bad lines its inputs had (and the archive
        records they skipped, by reason)."""
        info: dict[str, Any] = {"bad": bad, **({"skipped": skipped} if skipped else {})}
        atomic_write_bytes(self.dir / f"lines-{task.name}.json", json.dumps(info).encode())  # type: ignore[operator]

    def drop_lines(self, task: Task) -> None:
        if self.dir is not None:
            self.lines_path(task).unlink(missing_ok=True)
            (self.dir / f"lines-{task.name}.json").unlink(missing_ok=True)



def _read_lines(path: Path) -> Iterator[bytes]:
    import zstandard  # as core/shards.py does: loaded when a zstd file is read


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


def _signature_task(job: Job, store: Store, sh: mh.Shingler, d: DedupConfig, skip: bool, task: Task) -> None:
    """Phase 1 for one shard: its signatures, exact hashes and ids into ``store``."""
    batch = d.batch_docs
    sigs, exact, ids, texts = [], [], [], []
    lines = store.lines_writer(task)
    bad = 0
    skipped: dict[str, int] = {}
    with lines if lines is not None else nullcontext():
        for inp in task.inputs:
            st = ReadStats()
            for rec in read_records(inp, skip_bad=skip, stats=st, **job.ctx.io.limits()):
                ids.append(rec["id"])
                texts.append(rec["text"])
                exact.append(mh.exact_hash(rec["text"]))
                if lines is not None:
                    lines.write_line(dumps(rec))
                if len(texts) >= batch:
                    sigs.append(sh.signatures(texts))
                    texts = []
            bad += st.bad
            for why, n in st.skipped.items():
                skipped[why] = skipped.get(why, 0) + n
        if texts:
            sigs.append(sh.signatures(texts))
    if lines is not None:
        store.lines_done(task, bad, skipped)
    sig = np.concatenate(sigs) if sigs else np.empty((0, sh.num_perm), dtype=np.uint32)
    store.put(task, sig, np.array(exact, dtype=np.uint64).reshape(-1, 2), ids)


def phase_signatures(job: Job, store: Store, sh: mh.Shingler, d: DedupConfig, skip: bool) -> None:
    """Phase 1: signatures and exact hashes of this slice's shards that have none yet."""
    todo = [t for t in job.mine() if not store.has(t)]
    if not todo:
        return
    advance = job.add_bar("signatures", sum(f.size for t in todo for f in t.inputs) or None)
    workers = 1 if store.dir is None else d.workers  # (to stdout the signatures stay in this process)
    if n_workers(workers, len(todo)) > 1:
        sh.signatures(["warm"])  # load the compiled kernels once, before the fork
    for task, _ in in_workers(workers, todo, lambda t: _signature_task(job, store, sh, d, skip, t)):
        advance(sum(f.size for f in task.inputs))


def _shingle_sets(job: Job, sh: mh.Shingler, offsets: np.ndarray, docs: np.ndarray,
                  skip: bool, workers: int = 1, store: Store | None = None) -> dict[int, np.ndarray]:
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
        elif skip or any(is_warc(f.path) for f in task.inputs):  # (an archive has no record lines)
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


def phase_cluster(job: Job, store: Store, sh: mh.Shingler, d: DedupConfig, skip: bool, bands: int,
                  rows: int) -> DedupResult:
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


def phase_cluster_scaled(job: Job, store: Store, sh: mh.Shingler, d: DedupConfig, skip: bool,
                         backend: scale.Backend) -> DedupResult:
    """Phase 2 after a bucket map/reduce: candidates from the partitions' pair files, then clusters.

    Only the signature rows of candidate documents are read (``verify=estimate``)."""
    offsets, exact_first, pairs = scale.candidates(backend)

    def sig_rows(docs: np.ndarray) -> np.ndarray:
        owner = np.searchsorted(offsets, docs, side="right") - 1
        parts = [store.sig_rows(job.tasks[t], docs[owner == t] - offsets[t]) for t in np.unique(owner).tolist()]
        return np.concatenate(parts) if parts else np.empty((0, d.num_perm), dtype=np.uint32)

    return cluster_candidates(job, sh, d, skip, offsets, exact_first, pairs, sig_rows, store)


def cluster_candidates(job: Job, sh: mh.Shingler, d: DedupConfig, skip: bool, offsets: np.ndarray,
                       exact_first: np.ndarray, pairs: np.ndarray, sig_rows, store: Store | None = None) -> DedupResult:
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
    counts = DedupCounts(
        docs_in=n,
        docs_out=int(n - len(removed)),
        exact_duplicates=int((kind == EXACT).sum()),
        near_duplicates=int((kind == NEAR).sum()),
        duplicate_clusters=int(len(np.unique(root[removed]))),
        candidate_pairs=int(len(pairs)),
        verified_pairs=int(len(verified)),
    )
    return DedupResult(offsets, root, kind, similarity, counts)


def check_unique_ids(job: Job, store: Store, io_cfg: IOConfig) -> None:
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


def load_or_cluster(job: Job, store: Store, io_cfg: IOConfig, compute: Callable[[], DedupResult]) -> DedupResult:
    """The clustering, from ``OUT/.cptkit/clusters.npz`` or ``compute()`` (then cached there)."""
    path = None if job.stdout else job.state_path("clusters.npz")
    if path is not None and path.exists():
        z = np.load(path)
        return DedupResult(**{k: z[k] for k in DedupResult.ARRAYS},
                           counts=DedupCounts.of_rows(json.loads(str(z["counts"]))))
    check_unique_ids(job, store, io_cfg)
    res = compute()
    if path is not None:
        buf = io.BytesIO()
        np.savez(buf, **{k: getattr(res, k) for k in DedupResult.ARRAYS},
                 counts=np.array(json.dumps(res.counts.rows())))
        atomic_write_bytes(path, buf.getvalue())
    return res


def write_removed(job: Job, store: Store, res: DedupResult) -> None:
    """``OUT/_removed.jsonl``: one line per removed document, in input order."""
    offsets, root, kind, sim = res.offsets, res.root, res.kind, res.similarity
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
    job.write_bytes("_removed.jsonl", "".join(lines).encode("utf-8"))


def write_task(job: Job, store: Store, res: DedupResult, task: Task) -> TaskResult:
    """Phase 3 for one shard: its kept records; what :meth:`Job.complete` records of it besides
    what :meth:`Job.read` counted."""
    t0 = time.time()
    root = res.root
    base = int(res.offsets[task.index])
    removed = 0
    cached = store.lines(task)
    done = TaskResult()
    with job.writer(task) as w:
        if cached is None:
            for row, rec in enumerate(job.read(task)):  # job.read counts records_in and bad
                if root[base + row] == base + row:
                    w.write(rec)
                else:
                    removed += 1
        else:  # the records as phase 1 serialised them: the same bytes, no second parse
            path, done.bad, skipped = cached
            if skipped:
                done.extra[SKIPPED] = skipped
            for row, line in enumerate(_read_lines(path)):
                if root[base + row] == base + row:
                    w.write_line(line[:-1].decode("utf-8"))
                else:
                    removed += 1
                done.records_in += 1
            job.advance_read(task)
    done.records_out, done.files = w.records, list(w.files)
    done.extra |= {"removed": removed, "seconds": round(time.time() - t0, 3)}
    return done
