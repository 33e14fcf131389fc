"""The settings of ``cptkit dedup`` (``dedup.*``): shingling, MinHash, LSH banding, clustering backend.

The dedup package owns its config: :mod:`cptkit.dedup.cluster` and :mod:`cptkit.dedup.scale`
take a :class:`DedupConfig`, and :mod:`cptkit.steps.dedup` declares the step with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cptkit.core.config import check
from cptkit.dedup import minhash as mh

VERIFY = ("exact", "estimate", "none")
CLUSTER = ("memory", "mapreduce", "redis")
PHASES = ("all", "map", "reduce", "final")


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


def check_config(d: DedupConfig) -> None:
    check(d.ngram >= 1, "ngram", d.ngram, "must be >= 1")
    check(0.0 < d.threshold <= 1.0, "threshold", d.threshold, "must be in (0, 1]")
    check(d.num_perm >= 1, "num_perm", d.num_perm, "must be >= 1")
    check(d.verify in VERIFY, "verify", d.verify, f"must be one of {', '.join(VERIFY)}")
    check(d.tokenizer in mh.TOKEN_PATTERNS, "tokenizer", d.tokenizer, f"must be one of {', '.join(mh.TOKEN_PATTERNS)}")
    check(d.batch_docs >= 1, "batch_docs", d.batch_docs, "must be >= 1")
    check(d.cluster in CLUSTER, "cluster", d.cluster, f"must be one of {', '.join(CLUSTER)}")
    check(d.phase in PHASES, "phase", d.phase, f"must be one of {', '.join(PHASES)}")
    check(not (d.phase == "reduce" and d.cluster == "memory"), "phase", d.phase,
          "needs dedup.cluster=mapreduce or redis (memory has map and final)")
    check(1 <= d.partitions <= 9999, "partitions", d.partitions, "must be in [1, 9999]")
    check(d.redis_batch >= 1, "redis_batch", d.redis_batch, "must be >= 1")
    check(d.workers >= 0, "workers", d.workers, "must be >= 0 (0: one per CPU)")


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
