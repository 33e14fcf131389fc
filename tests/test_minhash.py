"""cptkit.dedup.minhash: banding maths, shingling, signatures, LSH candidates, clustering (real text)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch.lsh import _optimal_param

from cptkit.dedup import minhash as mh

MASK64 = (1 << 64) - 1


# -- banding ---------------------------------------------------------------------------------
def test_collision_probability_numbers():
    # SPEC §3: 16 x 8 catches ~95% of pairs at J = 0.8; the usual optimiser's 9 x 13 only ~40%
    assert mh.collision_probability(0.8, 16, 8) == pytest.approx(0.9470, abs=1e-4)
    assert mh.collision_probability(0.8, 9, 13) == pytest.approx(0.3991, abs=5e-4)
    assert mh.collision_probability(1.0, 1, 128) == 1.0
    assert mh.collision_probability(0.0, 128, 1) == 0.0
    # datasketch's optimiser really picks 9 x 13 for (0.8, 128)
    assert _optimal_param(0.8, 128, 0.5, 0.5) == (9, 13)


def test_lsh_params_reach_target_recall():
    assert mh.lsh_params(0.8, 128, 0.95) == (18, 7)
    assert mh.lsh_params(0.8, 128, 0.9) == (16, 8)
    for t in (0.5, 0.7, 0.8, 0.9):
        for target in (0.9, 0.95, 0.99):
            b, r = mh.lsh_params(t, 128, target)
            assert b * r <= 128
            assert mh.collision_probability(t, b, r) >= target
            if r < 128:  # one more row per band (all permutations in bands) misses the target
                assert mh.collision_probability(t, 128 // (r + 1), r + 1) < target
    with pytest.raises(ValueError):
        mh.lsh_params(0.8, 128, 1.0)


# -- shingling -------------------------------------------------------------------------------
def test_tokenize_words_and_cjk():
    assert mh.tokenize("Hello, World! foo_bar 3.14") == ["hello", "world", "foo_bar", "3", "14"]
    assert mh.tokenize("Python 的列表 list") == ["python", "的", "列", "表", "list"]
    assert mh.tokenize("A b", lowercase=False) == ["A", "b"]
    assert mh.tokenize("a,b  c", tokenizer="whitespace") == ["a,b", "c"]


def test_encode_fast_ascii_path_matches_regex(corpus_records):
    texts = [r["text"] for r in corpus_records]
    assert any(t.isascii() for t in texts) and any(not t.isascii() for t in texts)
    for tokenizer in ("words", "whitespace"):
        sh = mh.Shingler(tokenizer=tokenizer, seed=7)
        wh, off = sh.encode(texts)
        for i in range(0, len(texts), 37):
            words = mh.tokenize(texts[i], tokenizer)
            want = [mh.word_hash(w, 7) for w in words]
            assert wh[off[i]:off[i + 1]].tolist() == want


def _poly(words: list[int]) -> int:
    h = 0
    for w in words:
        h = (h * int(mh.POLY_M) + w) & MASK64
    return h


def test_shingle_hashes_are_the_ngram_polynomials(corpus_records):
    sh = mh.Shingler(ngram=13)
    text = next(r["text"] for r in corpus_records if r["source"] == "python-docs" and len(r["text"].split()) > 200)
    wh, off = sh.encode([text])
    words = wh.tolist()
    got = mh.shingle_hashes(wh, 13)
    want = sorted({_poly(words[i:i + 13]) for i in range(len(words) - 12)})
    assert got.tolist() == want
    # one hash per distinct 13-gram: no collisions on real text
    toks = mh.tokenize(text)
    assert len(got) == len({tuple(toks[i:i + 13]) for i in range(len(toks) - 12)})
    # short documents: exactly one shingle, the polynomial of all their words
    assert mh.shingle_hashes(wh[:5], 13).tolist() == [_poly(words[:5])]
    assert mh.shingle_hashes(np.empty(0, dtype=np.uint64), 13).tolist() == [int(mh.EMPTY)]


# -- signatures ------------------------------------------------------------------------------
def test_signatures_match_numpy_reference(corpus_records):
    sh = mh.Shingler(num_perm=64, seed=3)
    texts = [r["text"] for r in corpus_records[::50]]
    sig = sh.signatures(texts)
    wh, off = sh.encode(texts)
    for i in range(len(texts)):
        x = mh.shingle_hashes(wh[off[i]:off[i + 1]], 13) >> np.uint64(32)
        with np.errstate(over="ignore"):
            v = (sh.a[:, None] * x[None, :] + sh.b[:, None]) >> np.uint64(32)
        assert np.array_equal(sig[i], v.min(axis=1).astype(np.uint32))
    # batching does not change signatures
    assert np.array_equal(np.concatenate([sh.signatures(texts[:5]), sh.signatures(texts[5:])]), sig)


def _edit_span(words: list[str], frac: float, rng: random.Random) -> list[str]:
    """Replace a contiguous span of ``frac`` of the words with other words."""
    k = max(1, int(len(words) * frac))
    s = rng.randrange(0, len(words) - k)
    return words[:s] + [f"edit{rng.randrange(10**6)}" for _ in range(k)] + words[s + k:]


def _ngrams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    toks = mh.tokenize(text)
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def test_estimated_jaccard_tracks_exact_jaccard(corpus_records):
    rng = random.Random(0)
    sh = mh.Shingler(num_perm=128)
    docs = [r["text"].split() for r in corpus_records if r["lang"] == "en" and len(r["text"].split()) >= 150]
    a_texts, b_texts = [], []
    for words in docs[:60]:
        a_texts.append(" ".join(words))
        b_texts.append(" ".join(_edit_span(words, rng.choice([0.02, 0.05, 0.1, 0.2]), rng)))
    sig = sh.signatures(a_texts + b_texts)
    sets = sh.shingle_sets(a_texts + b_texts)
    n = len(a_texts)
    pairs = np.array([[i, n + i] for i in range(n)])
    est = mh.estimated_jaccard(sig, pairs)
    exact = np.array([mh.jaccard_sorted(sets[i], sets[n + i]) for i in range(n)])
    ref = np.array([mh.jaccard_sets(_ngrams(a), _ngrams(b)) for a, b in zip(a_texts, b_texts, strict=True)])
    assert np.allclose(exact, ref)  # 64-bit shingle hashes give the exact Jaccard of the 13-grams
    assert exact.min() < 0.6 < 0.9 < exact.max()
    err = np.abs(est - exact)
    assert err.mean() < 0.035  # sd of the estimate at 128 permutations is <= 0.044
    assert err.max() < 0.15


# -- LSH, verification, clustering ----------------------------------------------------------
def test_candidate_pairs_find_planted_duplicates(corpus_records):
    rng = random.Random(1)
    sh = mh.Shingler()
    texts = [r["text"] for r in corpus_records]
    en = [i for i, r in enumerate(corpus_records) if r["lang"] == "en" and len(r["text"].split()) >= 200]
    planted = []
    for i in en[:40]:
        planted.append((i, len(texts)))
        texts.append(" ".join(_edit_span(texts[i].split(), 0.02, rng)))
    sig = sh.signatures(texts)
    b, r = mh.lsh_params(0.8, 128, 0.95)
    pairs = mh.candidate_pairs(mh.band_keys(sig, b, r))
    assert np.all(pairs[:, 0] < pairs[:, 1])
    found = {tuple(p) for p in pairs.tolist()}
    assert sum(p in found for p in planted) >= 39
    assert len(pairs) < 3 * len(planted) + 50  # the distinct documents rarely collide


def test_bucket_star_and_chain():
    keys = np.zeros((40, 1), dtype=np.uint64)  # one bucket of 40
    star = mh.candidate_pairs(keys, all_pairs_max=16)
    assert len(star) == 39 + 38  # star from 0 plus the chain (0,1) shared
    assert len(mh.candidate_pairs(keys, all_pairs_max=64)) == 40 * 39 // 2
    roots = mh.union_find_roots(40, star)
    assert roots.tolist() == [0] * 40


def test_union_find_keeps_smallest_index():
    roots = mh.union_find_roots(7, np.array([[3, 5], [5, 6], [1, 2], [2, 6]]))
    assert roots.tolist() == [0, 1, 1, 1, 4, 1, 1]
    assert mh.union_find_roots(3, np.empty((0, 2), dtype=np.int64)).tolist() == [0, 1, 2]


def test_first_occurrence_and_exact_hash():
    texts = ["A b", "x", "a   B", "y", "x"]
    keys = np.array([mh.exact_hash(t) for t in texts], dtype=np.uint64)
    assert mh.first_occurrence(keys).tolist() == [0, 1, 0, 3, 1]


def test_jaccard_sorted():
    assert mh.jaccard_sorted(np.array([1, 2, 3], dtype=np.uint64), np.array([2, 3, 4], dtype=np.uint64)) == 0.5
    assert mh.jaccard_sorted(np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)) == 1.0
