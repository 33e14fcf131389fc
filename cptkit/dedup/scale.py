"""Scale-out clustering for ``cptkit dedup``: LSH buckets as a map/reduce over files, or in Redis.

The in-memory clustering of :mod:`cptkit.steps.dedup` holds every signature on one node. Here the
band buckets never meet in one process (docs/dedup.md, "Scale-out"):

* **map** (one task per input shard, sliced by ``shard.index/count``): the shard's band keys
  ``(band, key, doc)`` and exact-text hashes ``(hi, lo, doc)`` go to ``dedup.partitions`` partitions
  by a hash of the key: ``OUT/.cptkit/buckets/p-PPPP/m-TTTTT.npz`` (``cluster=mapreduce``), or
  Redis sets, one per bucket, under a run namespace (``cluster=redis``). Marker:
  ``OUT/.cptkit/map/TTTTT.json`` (with the shard's document count).
* **reduce** (one task per partition, sliced the same way): sort the partition's entries into
  buckets; buckets of 2 .. ``bucket_all_pairs_max`` documents give their pairs, bigger ones keep
  their member list; equal exact hashes give ``(duplicate, first)`` rows.
  ``OUT/.cptkit/pairs/p-PPPP.npz`` and marker ``OUT/.cptkit/reduce/p-PPPP.json``.
* **final** (:func:`candidates`): the exact duplicates of all partitions fix the documents that
  enter LSH; :func:`cptkit.dedup.minhash.merge_candidates` drops the others and re-pairs big buckets, which
  gives exactly the candidate pairs of the in-memory path. Verification and union-find follow.

Documents are named ``task << 32 | row`` during map (global indices need every shard's count) and
by their global input index from reduce on.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.progress import log
from cptkit.core.redact import redact_url
from cptkit.core.shards import atomic_write_bytes, atomic_write_json
from cptkit.dedup import minhash as mh
from cptkit.dedup.config import DedupConfig

ROW_BITS = np.uint64(32)


def pack(task: int, n: int) -> np.ndarray:
    """Map-phase names of a shard's ``n`` documents: ``task << 32 | row``."""
    return (np.uint64(task) << ROW_BITS) | np.arange(n, dtype=np.uint64)


def to_global(packed: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Global input indices of packed ``task << 32 | row`` names, given each task's first index."""
    packed = np.asarray(packed, dtype=np.uint64)
    return offsets[(packed >> ROW_BITS).astype(np.int64)] + (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)


def mask_url(url: str) -> str:
    """A Redis URL without its password (for logs, errors and the manifest): ``cptkit.core.redact``'s rule."""
    return redact_url(url)


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


class Backend:
    """Where the buckets live between map and reduce; subclasses store and read them."""

    name = ""

    def __init__(self, job: Job, d: DedupConfig, bands: int):
        self.job, self.bands = job, bands
        self.partitions: int = d.partitions
        self.all_pairs_max: int = d.bucket_all_pairs_max
        self.exact: bool = d.exact
        self.seed: int = d.seed
        self.state = job.state_dir

    # -- markers ---------------------------------------------------------------------------
    def map_marker(self, task: Task) -> Path:
        return self.state / "map" / f"{task.name}.json"

    def reduce_marker(self, p: int) -> Path:
        return self.state / "reduce" / f"p-{p:04d}.json"

    def pair_file(self, p: int) -> Path:
        return self.state / "pairs" / f"p-{p:04d}.npz"

    def my_partitions(self) -> list[int]:
        return [p for p in range(self.partitions) if p % self.job.shard_count == self.job.shard_index]

    def missing_maps(self) -> list[str]:
        return [t.name for t in self.job.tasks if not self.map_marker(t).exists()]

    def missing_reduces(self) -> list[int]:
        return [p for p in range(self.partitions) if not self.reduce_marker(p).exists()]

    def offsets(self) -> np.ndarray:
        """Each task's first global document index (and the total at the end), from the map markers."""
        counts = [json.loads(self.map_marker(t).read_text())["docs"] for t in self.job.tasks]
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return offsets

    # -- phases ----------------------------------------------------------------------------
    def entries(self, task: Task, sig: np.ndarray, exact: np.ndarray, band_keys: np.ndarray) -> dict:
        """A shard's bucket entries, flattened (doc-major) with each entry's partition."""
        n = sig.shape[0]
        docs = pack(task.index, n)
        keys = band_keys.ravel()
        out = {"band": np.tile(np.arange(self.bands, dtype=np.uint16), n), "key": keys,
               "doc": np.repeat(docs, self.bands), "part": mh.partition_of(keys, self.partitions)}
        if self.exact:
            out |= {"xhi": exact[:, 0].copy(), "xlo": exact[:, 1].copy(), "xdoc": docs,
                    "xpart": mh.partition_of(exact[:, 0] ^ exact[:, 1], self.partitions)}
        return out

    def map(self, store, bands: int, rows: int) -> None:
        """Map phase for this slice's shards that have no map marker (signatures must exist)."""
        todo = [t for t in self.job.mine() if not self.map_marker(t).exists()]
        if not todo:
            return
        advance = self.job.add_bar(f"map: buckets ({self.name})", len(todo))
        for task in todo:
            sig = store.sig(task)
            keys = mh.band_keys(sig, bands, rows, self.seed)
            ent = self.entries(task, sig, store.exact(task), keys)
            self.put(task, ent)
            atomic_write_json(self.map_marker(task), {"task": task.name, "docs": int(sig.shape[0]),
                                                      "entries": int(len(ent["key"]))})
            advance(1)

    def reduce(self) -> None:
        """Reduce phase for this slice's partitions that have no reduce marker (all maps done)."""
        todo = [p for p in self.my_partitions() if not self.reduce_marker(p).exists()]
        if not todo:
            return
        offsets = self.offsets()
        self.check_maps()
        advance = self.job.add_bar(f"reduce: partitions ({self.name})", len(todo))
        for p in todo:
            band, key, doc, xhash, xdoc = self.gather(p, offsets)
            pairs, big_members, big_sizes = mh.bucket_candidates(band, key, doc, self.all_pairs_max)
            exact = mh.exact_groups(xhash, xdoc)
            atomic_write_bytes(self.pair_file(p), _npz(pairs=pairs, big_members=big_members, big_sizes=big_sizes,
                                                       exact=exact))
            atomic_write_json(self.reduce_marker(p), {
                "partition": p, "entries": int(len(key)), "small_bucket_pairs": int(len(pairs)),
                "big_buckets": int(len(big_sizes)), "exact_duplicates": int(len(exact))})
            advance(1)

    def check_maps(self) -> None:
        """Raise if the stored map output is incomplete (e.g. a Redis restarted without persistence)."""

    def cleanup(self) -> None:
        """Drop the bucket entries once the output is complete."""

    # -- storage ---------------------------------------------------------------------------
    def put(self, task: Task, ent: dict) -> None:
        raise CptkitError(f"dedup.cluster={self.name}: no storage")  # subclasses implement

    def gather(self, p: int, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
        """Partition ``p``'s ``(band, key, doc)`` and ``(hash n×2, doc)`` entries, docs as global indices."""
        raise CptkitError(f"dedup.cluster={self.name}: no storage")


class FileBackend(Backend):
    """Bucket entries as numpy files ``OUT/.cptkit/buckets/p-PPPP/m-TTTTT.npz`` on a shared disk."""

    name = "mapreduce"

    def part_dir(self, p: int) -> Path:
        return self.state / "buckets" / f"p-{p:04d}"

    def put(self, task: Task, ent: dict) -> None:
        cols = ("band", "key", "doc")
        xcols = ("xhi", "xlo", "xdoc")
        by = np.argsort(ent["part"], kind="stable")
        cut = np.searchsorted(ent["part"][by], np.arange(self.partitions + 1))
        if self.exact:
            xby = np.argsort(ent["xpart"], kind="stable")
            xcut = np.searchsorted(ent["xpart"][xby], np.arange(self.partitions + 1))
        for p in range(self.partitions):
            arrays = {c: ent[c][by[cut[p]:cut[p + 1]]] for c in cols}
            if self.exact:
                arrays |= {c: ent[c][xby[xcut[p]:xcut[p + 1]]] for c in xcols}
            path = self.part_dir(p) / f"m-{task.name}.npz"
            if any(len(a) for a in arrays.values()):
                atomic_write_bytes(path, _npz(**arrays))
            else:
                path.unlink(missing_ok=True)

    def gather(self, p: int, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
        cols: dict[str, list[np.ndarray]] = {c: [] for c in ("band", "key", "doc", "xhi", "xlo", "xdoc")}
        for task in self.job.tasks:
            path = self.part_dir(p) / f"m-{task.name}.npz"
            if path.exists():
                with np.load(path) as z:
                    for c in cols:
                        if c in z:
                            cols[c].append(z[c])
        cat = {c: np.concatenate(v) if v else np.empty(0, dtype=np.uint64) for c, v in cols.items()}
        xhash = np.stack([cat["xhi"], cat["xlo"]], axis=1).astype(np.uint64)
        return (cat["band"].astype(np.uint16), cat["key"].astype(np.uint64), to_global(cat["doc"], offsets),
                xhash, to_global(cat["xdoc"], offsets))

    def cleanup(self) -> None:
        shutil.rmtree(self.state / "buckets", ignore_errors=True)


# One atomic call per batch: add each member to its bucket set; a bucket that has just reached
# two members is listed in its partition's set of multi-member buckets (read back by reduce).
# KEYS = n bucket keys, then their n partition-list keys; ARGV = n members. Idempotent on retry.
_ADD = """
local n = #ARGV
for i = 1, n do
  if redis.call('SADD', KEYS[i], ARGV[i]) == 1 and redis.call('SCARD', KEYS[i]) == 2 then
    redis.call('SADD', KEYS[n + i], KEYS[i])
  end
end
return n
"""


class RedisBackend(Backend):
    """LSH state in Redis: one set of document names per band bucket and per exact-text hash.

    Keys, under the run namespace ``NS`` (``dedup.redis_namespace``, default
    ``cptkit:dedup:<hash of config, output and inputs>``): ``NS:b:<band,key>`` and
    ``NS:x:<hash>`` (sets of ``task << 32 | row`` integers), ``NS:bm:<p>`` / ``NS:xm:<p>`` (the
    buckets of partition p with at least two members), ``NS:maps`` (finished map tasks).
    """

    name = "redis"

    def __init__(self, job: Job, d: DedupConfig, bands: int):
        super().__init__(job, d, bands)
        import redis

        self._errors = redis.exceptions.RedisError
        self.url = mask_url(d.redis_url)
        self.batch: int = d.redis_batch
        ns = d.redis_namespace
        if ns is None:
            h = hashlib.sha256(job.identity.encode())
            h.update(str(job.out.resolve()).encode())
            for f in job.inputs:
                h.update(f"\0{Path(f.path).resolve()}\0{f.size}".encode())
            ns = f"cptkit:dedup:{h.hexdigest()[:16]}"
        self.ns: str = ns
        try:
            self.r = redis.Redis.from_url(d.redis_url, socket_connect_timeout=5, socket_timeout=300)
            self.r.ping()
        except (self._errors, ValueError) as e:
            raise CptkitError(f"dedup.redis_url={self.url}: cannot reach Redis: {e}") from None
        self.add = self.r.register_script(_ADD)

    def _key(self, suffix: str) -> bytes:
        return f"{self.ns}:{suffix}".encode()

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except self._errors as e:
            raise CptkitError(f"Redis {self.url} ({self.ns}): {what} failed: {e}") from None

    def put(self, task: Task, ent: dict) -> None:
        self._call(f"map of shard {task.name}", self._put, task, ent)

    def _put(self, task: Task, ent: dict) -> None:
        groups = [(ent["band"].astype(">u2").view(np.uint8).reshape(-1, 2),
                   ent["key"].astype(">u8").view(np.uint8).reshape(-1, 8), ent["doc"], ent["part"], "b", "bm")]
        if self.exact:
            groups.append((ent["xhi"].astype(">u8").view(np.uint8).reshape(-1, 8),
                           ent["xlo"].astype(">u8").view(np.uint8).reshape(-1, 8), ent["xdoc"], ent["xpart"],
                           "x", "xm"))
        multi = [[self._key(f"{m}:{p}") for p in range(self.partitions)] for m in ("bm", "xm")]
        for hi, lo, docs, parts, kind, mkind in groups:
            raw = np.concatenate([hi, lo], axis=1)
            prefix = self._key(kind + ":")
            names = [prefix + row.tobytes() for row in raw]
            lists = multi[0] if mkind == "bm" else multi[1]
            pipe = self.r.pipeline(transaction=False)
            for s in range(0, len(names), self.batch):
                e = min(s + self.batch, len(names))
                keys = names[s:e] + [lists[p] for p in parts[s:e].tolist()]
                self.add(keys=keys, args=docs[s:e].tolist(), client=pipe)
                if (s // self.batch) % 16 == 15:
                    pipe.execute()
            pipe.execute()
        self.r.sadd(self._key("maps"), task.name)

    def check_maps(self) -> None:
        names = [t.name for t in self.job.tasks]
        have = self._call("reading the finished map tasks", self.r.smismember, self._key("maps"), names)
        lost = [n for n, ok in zip(names, have, strict=True) if not ok]
        if lost:
            raise CptkitError(f"Redis {self.url} ({self.ns}) lacks the buckets of {len(lost)} map tasks "
                              f"(first: {lost[0]}); was it restarted without persistence? Delete "
                              f"{self.state / 'map'} and rerun dedup.phase=map")

    def gather(self, p: int, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
        return self._call(f"reduce of partition {p}", self._gather, p, offsets)

    def _buckets(self, multi: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Members of every bucket listed in the set ``multi``: (bucket number, packed doc) rows."""
        bucket, docs = [], []
        names = sorted(set(self.r.sscan_iter(multi, count=1000)))  # SSCAN may repeat a name
        for s in range(0, len(names), 1000):
            pipe = self.r.pipeline(transaction=False)
            for name in names[s:s + 1000]:
                pipe.smembers(name)
            for k, members in enumerate(pipe.execute()):
                bucket += [s + k] * len(members)
                docs += [int(m) for m in members]
        return np.array(bucket, dtype=np.uint64), np.array(docs, dtype=np.uint64)

    def _gather(self, p: int, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
        bucket, docs = self._buckets(self._key(f"bm:{p}"))
        xbucket, xdocs = self._buckets(self._key(f"xm:{p}")) if self.exact else (np.empty(0, np.uint64),) * 2
        xhash = np.stack([xbucket, np.zeros_like(xbucket)], axis=1)
        return (np.zeros(len(bucket), dtype=np.uint16), bucket, to_global(docs, offsets), xhash,
                to_global(xdocs, offsets))

    def cleanup(self) -> None:
        def drop() -> int:
            n = 0
            batch = []
            for key in self.r.scan_iter(match=f"{self.ns}:*".encode(), count=10000):
                batch.append(key)
                if len(batch) >= 10000:
                    n += self.r.unlink(*batch)
                    batch = []
            return n + (self.r.unlink(*batch) if batch else 0)

        n = self._call("cleanup", drop)
        log.info("Redis %s: removed %d keys of %s", self.url, n, self.ns)


def make_backend(job: Job, d: DedupConfig, bands: int) -> Backend | None:
    """The scale-out backend of ``dedup.cluster`` (None for ``memory``); ``d`` is the typed
    ``dedup`` section."""
    name = d.cluster
    if name == "memory":
        return None
    if job.stdout:
        raise CptkitError(f"dedup.cluster={name} keeps its buckets under --out: pass a directory, not -")
    return FileBackend(job, d, bands) if name == "mapreduce" else RedisBackend(job, d, bands)


def candidates(backend: Backend) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, exact_first, pairs)`` from every partition's reduce output (final phase)."""
    offsets = backend.offsets()
    n = int(offsets[-1])
    exact_first = np.arange(n, dtype=np.int64)
    pairs, big_members, big_sizes = [], [], []
    for p in range(backend.partitions):
        with np.load(backend.pair_file(p)) as z:
            pairs.append(z["pairs"])
            big_members.append(z["big_members"])
            big_sizes.append(z["big_sizes"])
            ex = z["exact"]
        exact_first[ex[:, 0]] = ex[:, 1]
    keep = exact_first == np.arange(n)
    return offsets, exact_first, mh.merge_candidates(pairs, big_members, big_sizes, keep, backend.all_pairs_max)

