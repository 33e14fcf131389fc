"""Seeded hashes: functions of (seed, key) only, with the values every stored output relies on."""

from __future__ import annotations

import hashlib

from cptkit.text.hashing import fast_seeded_hash, rng_for, seeded_hash, unit_hash


def test_seeded_hashes_are_pinned_and_depend_on_seed_and_key():
    # pinned: held-out splits, samples and corruption edits of existing outputs depend on these
    want = 2399808621546349282  # BLAKE2b-64 of b"7\x00doc-1", big-endian
    assert seeded_hash(7, "doc-1") == want == int.from_bytes(hashlib.blake2b(b"7\x00doc-1", digest_size=8).digest(), "big")
    assert unit_hash(7, "doc-1") == want / 2**64 and 0 <= unit_hash(7, "doc-1") < 1
    assert rng_for(7, "doc-1").random() == 0.23595730668831727
    assert len({seeded_hash(s, k) for s in (0, 1) for k in ("a", "b")}) == 4
    assert fast_seeded_hash(3, "doc-1") == 11763347382191930375  # xxh64(b"doc-1", seed=3)
    assert fast_seeded_hash(3, "doc-1") != fast_seeded_hash(4, "doc-1")


def test_unit_hash_is_uniform_enough_for_splits():
    share = sum(unit_hash(0, f"id{i}") < 0.2 for i in range(20000)) / 20000
    assert abs(share - 0.2) < 0.01
