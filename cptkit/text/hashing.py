"""Seeded hashes: every "random but reproducible" choice keyed by a record (its held-out split,
sample, eval set, corruption generator) is a function of ``(seed, key)`` only, the same in every
process, on every machine and in every run order.

* :func:`seeded_hash` (BLAKE2b, 64 bits): per-record decisions made a few thousand times
  (classifier splits, annotation samples, corruption generators).
* :func:`fast_seeded_hash` (xxHash64): per-record decisions made millions of times (build-mix's
  held-out documents and domain shuffles), ~10× cheaper.
"""

from __future__ import annotations

import hashlib
import random

import xxhash


def seeded_hash(seed: int, key: str) -> int:
    """A 64-bit integer determined by ``(seed, key)`` only."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest(), "big")


def unit_hash(seed: int, key: str) -> float:
    """A number in [0, 1) determined by ``(seed, key)`` only."""
    return seeded_hash(seed, key) / 2**64


def rng_for(seed: int, key: str) -> random.Random:
    """A generator of its own for ``key`` (e.g. one record), seeded from ``(seed, key)`` only."""
    return random.Random(seeded_hash(seed, key))


def fast_seeded_hash(seed: int, key: str) -> int:
    """xxHash64 of ``key`` with ``seed`` (a 64-bit integer)."""
    return xxhash.xxh64_intdigest(key.encode(), seed=seed)
