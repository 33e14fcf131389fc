"""MinHash-LSH near-duplicate detection: pure, vectorised algorithm code (SPEC §3).

Pipeline for one batch of documents:

1. **Normalise and tokenise** (:func:`tokenize`): lower-case; the ``words`` tokenizer (the
   ``minhash`` preset of :mod:`cptkit.text.tokenize`) takes runs of word characters (``[^\\W]``,
   underscore included) and every CJK/kana/hangul character as a token of its own, so Chinese
   text shingles by characters; ``whitespace`` (the ``whitespace`` preset) splits on spaces.
2. **Hash every word** (:func:`word_hash`): FNV-1a 64 over its UTF-8 bytes, seeded, then
   murmur3's ``fmix64``, in one compiled pass over the document's token bytes.
3. **Shingles** are word n-grams (default 13). A shingle's 64-bit hash is the polynomial
   ``sum_k h(w_{i+k}) * M**(n-1-k) mod 2**64`` over its word hashes, computed by a rolling
   update. A document with fewer than ``n`` words has exactly one shingle: the polynomial over
   all its words. A document without any word has one fixed shingle (``EMPTY``), so all empty
   documents are duplicates of each other.
4. **MinHash**: permutation ``p`` maps a shingle's key ``x = h >> 32`` (32 bits) to
   ``(a_p * x + b_p) mod 2**64 >> 32`` (Dietzfelbinger's multiply-add-shift family, strongly
   universal for 32-bit keys, with ``a_p, b_p`` 64-bit draws of ``numpy.random.PCG64(seed)``);
   the signature keeps the minimum per permutation as ``uint32``. The inner loop is compiled
   with numba.
5. **LSH banding** (:func:`band_keys`, :func:`candidate_pairs`): ``b`` bands of ``r`` rows; docs
   whose band rows are equal share a bucket. :func:`collision_probability` gives the chance
   ``1 - (1 - J**r)**b`` that a pair of Jaccard ``J`` becomes a candidate; :func:`lsh_params`
   picks ``(b, r)`` from a target recall at the threshold.
6. **Verification** of candidate pairs: exact Jaccard of the 64-bit shingle-hash sets
   (:func:`jaccard_sorted`) or the signature estimate (:func:`estimated_jaccard`).
7. **Clusters**: union-find that keeps the smallest (first) index as the root
   (:func:`union_find_roots`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numba
import numpy as np
import xxhash

from cptkit.text.tokenize import word_tokenizer

POLY_M = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the shingle polynomial
EMPTY = np.uint64(0x5BD1E9955BD1E995)  # the one shingle of a document without words

# dedup.tokenizer name -> its word-tokenizer preset (cptkit.text.tokenize)
TOKEN_PATTERNS = {"words": word_tokenizer("minhash"), "whitespace": word_tokenizer("whitespace")}


def tokenize(text: str, tokenizer: str = "words", lowercase: bool = True) -> list[str]:
    """Split ``text`` into the words that shingles are made of (see the module docstring)."""
    if tokenizer not in TOKEN_PATTERNS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {sorted(TOKEN_PATTERNS)}")
    return TOKEN_PATTERNS[tokenizer].findall(text.lower() if lowercase else text)


def normalize_exact(text: str) -> str:
    """The text that exact-duplicate detection hashes: lower-cased, whitespace runs collapsed."""
    return " ".join(text.lower().split())


def exact_hash(text: str) -> tuple[int, int]:
    """128-bit ``xxh3_128`` of :func:`normalize_exact`, as two 64-bit halves."""
    h = xxhash.xxh3_128_intdigest(normalize_exact(text).encode())
    return h >> 64, h & 0xFFFFFFFFFFFFFFFF


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` uint64 coefficients of the ``num_perm`` hash functions (``a`` odd)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
    b = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False)
    return a, b


# -- the compiled kernels ----------------------------------------------------------------------
MASK64_INT = (1 << 64) - 1
FNV_PRIME = 0x100000001B3
FNV_BASIS = 0xCBF29CE484222325


def word_hash(word: str | bytes, seed: int) -> int:
    """Reference (pure Python) word hash: FNV-1a 64 over UTF-8 bytes from ``basis ^ seed``, then
    murmur3's fmix64 finaliser. :func:`_hash_words` computes the same in bulk."""
    data = word.encode("utf-8") if isinstance(word, str) else word
    h = FNV_BASIS ^ (seed & MASK64_INT)
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64_INT
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK64_INT
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK64_INT
    return h ^ (h >> 33)


@numba.njit(cache=True, nogil=True, inline="always")
def _fmix64(h: np.uint64) -> np.uint64:
    """murmur3's 64-bit finaliser (the end of :func:`word_hash`)."""
    s33 = np.uint64(33)
    h ^= h >> s33
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> s33
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> s33)


@numba.njit(cache=True, nogil=True)
def _hash_words(buf: np.ndarray, doc_starts: np.ndarray, seed: np.uint64, words: np.ndarray,
                offsets: np.ndarray) -> int:
    """Hash the tokens of each document (``buf[doc_starts[d]:doc_starts[d+1]]``, tokens separated by
    ASCII whitespace) into ``words``; ``offsets[d]`` is document d's first word. Returns the count."""
    prime = np.uint64(0x100000001B3)
    basis = np.uint64(0xCBF29CE484222325) ^ seed
    k = 0
    for d in range(doc_starts.shape[0] - 1):
        offsets[d] = k
        inword = False
        h = basis
        for i in range(doc_starts[d], doc_starts[d + 1]):
            c = buf[i]
            if c == 32 or (9 <= c <= 13):
                if inword:
                    words[k] = _fmix64(h)
                    k += 1
                    inword = False
            else:
                if not inword:
                    h = basis
                    inword = True
                h = (h ^ np.uint64(c)) * prime
        if inword:
            words[k] = _fmix64(h)
            k += 1
    offsets[doc_starts.shape[0] - 1] = k
    return k


@numba.njit(cache=True, nogil=True)
def _doc_shingles(words: np.ndarray, n: int, out: np.ndarray) -> int:
    """Write the 64-bit shingle hashes of one document's word hashes into ``out``; return count."""
    length = words.shape[0]
    m = np.uint64(0x9E3779B97F4A7C15)
    if length == 0:
        out[0] = np.uint64(0x5BD1E9955BD1E995)
        return 1
    if length < n:
        h = np.uint64(0)
        for i in range(length):
            h = h * m + words[i]
        out[0] = h
        return 1
    top = np.uint64(1)  # M**(n-1)
    for _ in range(n - 1):
        top = top * m
    h = np.uint64(0)
    for i in range(n):
        h = h * m + words[i]
    out[0] = h
    for i in range(1, length - n + 1):
        h = (h - words[i - 1] * top) * m + words[i + n - 1]
        out[i] = h
    return length - n + 1


@numba.njit(cache=True, nogil=True)
def _signatures_kernel(word_hashes: np.ndarray, offsets: np.ndarray, n: int, a: np.ndarray,
                       b: np.ndarray, out: np.ndarray) -> None:
    num_perm = a.shape[0]
    ndocs = offsets.shape[0] - 1
    longest = 1
    for d in range(ndocs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    buf = np.empty(longest, dtype=np.uint64)
    sig = np.empty(num_perm, dtype=np.uint64)
    shift = np.uint64(32)
    for d in range(ndocs):
        k = _doc_shingles(word_hashes[offsets[d]:offsets[d + 1]], n, buf)
        for p in range(num_perm):
            sig[p] = np.uint64(0xFFFFFFFF)
        for i in range(k):
            x = buf[i] >> shift
            for p in range(num_perm):
                v = (a[p] * x + b[p]) >> shift
                if v < sig[p]:
                    sig[p] = v
        for p in range(num_perm):
            out[d, p] = np.uint32(sig[p])


def signatures(word_hashes: np.ndarray, offsets: np.ndarray, ngram: int, a: np.ndarray,
               b: np.ndarray) -> np.ndarray:
    """MinHash signatures (``uint32``, docs × permutations) of documents given as word hashes.

    ``word_hashes[offsets[d]:offsets[d+1]]`` are document ``d``'s word hashes (uint64).
    """
    out = np.empty((len(offsets) - 1, len(a)), dtype=np.uint32)
    _signatures_kernel(np.ascontiguousarray(word_hashes, dtype=np.uint64),
                       np.ascontiguousarray(offsets, dtype=np.int64), int(ngram), a, b, out)
    return out


def shingle_hashes(word_hashes: np.ndarray, ngram: int) -> np.ndarray:
    """The sorted, distinct 64-bit shingle hashes of one document (its shingle set)."""
    words = np.ascontiguousarray(word_hashes, dtype=np.uint64)
    out = np.empty(max(len(words) - ngram + 1, 1), dtype=np.uint64)
    k = _doc_shingles(words, int(ngram), out)
    return np.unique(out[:k])


class Shingler:
    """Turns texts into word hashes, signatures and shingle sets with one fixed configuration.

    Tokens become one whitespace-separated byte string per document (ASCII text through a
    ``bytes.translate`` table, other text through the regex); a compiled loop hashes the words.
    """

    def __init__(self, ngram: int = 13, num_perm: int = 128, seed: int = 42, tokenizer: str = "words",
                 lowercase: bool = True):
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {ngram}")
        if num_perm < 1:
            raise ValueError(f"num_perm must be >= 1, got {num_perm}")
        if tokenizer not in TOKEN_PATTERNS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {sorted(TOKEN_PATTERNS)}")
        self.ngram, self.num_perm, self.seed = ngram, num_perm, seed
        self.lowercase = lowercase
        self._findall = TOKEN_PATTERNS[tokenizer].findall
        self._table = TOKEN_PATTERNS[tokenizer].ascii_table(lowercase)
        self.a, self.b = permutations(num_perm, seed)

    def word_hash(self, word: str) -> int:
        return word_hash(word, self.seed)

    def token_bytes(self, text: str) -> bytes:
        """The document as UTF-8 tokens separated by whitespace (ASCII: one ``bytes.translate``)."""
        if text.isascii():
            return text.encode("ascii").translate(self._table)
        return " ".join(self._findall(text.lower() if self.lowercase else text)).encode("utf-8")

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Word hashes of all ``texts`` concatenated, and the ``offsets`` delimiting each text."""
        parts = [self.token_bytes(t) for t in texts]
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), out=starts[1:])
        buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
        words = np.empty(len(buf) // 2 + 1, dtype=np.uint64)
        offsets = np.empty(len(parts) + 1, dtype=np.int64)
        k = _hash_words(buf, starts, np.uint64(self.seed & MASK64_INT), words, offsets)
        return words[:k], offsets

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """MinHash signatures of ``texts`` (``uint32``, len(texts) × num_perm)."""
        wh, offsets = self.encode(texts)
        return signatures(wh, offsets, self.ngram, self.a, self.b)

    def shingle_sets(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's sorted distinct 64-bit shingle hashes."""
        wh, offsets = self.encode(texts)
        return [shingle_hashes(wh[offsets[i]:offsets[i + 1]], self.ngram) for i in range(len(texts))]


# -- banding -----------------------------------------------------------------------------------
def collision_probability(j: float, bands: int, rows: int) -> float:
    """P(a pair with Jaccard ``j`` shares at least one of ``bands`` buckets of ``rows`` rows)."""
    return 1.0 - (1.0 - float(j) ** rows) ** bands


def lsh_params(threshold: float, num_perm: int, target_recall: float = 0.95) -> tuple[int, int]:
    """``(bands, rows)`` catching at least ``target_recall`` of pairs at ``threshold``.

    Takes the most rows per band (fewest false candidates) for which ``num_perm // rows`` bands
    reach the target; e.g. (0.8, 128, 0.95) → (18, 7) with P = 0.986, (0.8, 128, 0.9) → (16, 8).
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if not 0.0 < target_recall < 1.0:
        raise ValueError(f"target_recall must be in (0, 1), got {target_recall}")
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if collision_probability(threshold, bands, rows) >= target_recall:
            return bands, rows
    raise ValueError(f"no banding of {num_perm} permutations reaches recall {target_recall} at J={threshold}")


def band_keys(sig: np.ndarray, bands: int, rows: int, seed: int = 0) -> np.ndarray:
    """A 64-bit key per document and band (docs × bands): a hash of the band's ``rows`` values."""
    if bands * rows > sig.shape[1]:
        raise ValueError(f"bands*rows = {bands * rows} exceeds num_perm = {sig.shape[1]}")
    rng = np.random.Generator(np.random.PCG64(seed + 0x5EED))
    mult = rng.integers(0, 2**64, size=rows, dtype=np.uint64) | np.uint64(1)
    keys = np.zeros((sig.shape[0], bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(bands):
            block = sig[:, k * rows:(k + 1) * rows].astype(np.uint64)
            h = np.full(sig.shape[0], k, dtype=np.uint64)
            for j in range(rows):
                h = (h ^ block[:, j]) * mult[j]
                h ^= h >> np.uint64(29)
            keys[:, k] = h
    return keys


@numba.njit(cache=True)
def _bucket_pairs(members: np.ndarray, starts: np.ndarray, all_pairs_max: int) -> np.ndarray:
    total = 0
    for g in range(starts.shape[0] - 1):
        size = starts[g + 1] - starts[g]
        total += size * (size - 1) // 2 if size <= all_pairs_max else 2 * (size - 1)
    out = np.empty(total, dtype=np.uint64)
    k = 0
    for g in range(starts.shape[0] - 1):
        s, e = starts[g], starts[g + 1]
        if e - s <= all_pairs_max:
            for i in range(s, e):
                for j in range(i + 1, e):
                    out[k] = (np.uint64(members[i]) << np.uint64(32)) | np.uint64(members[j])
                    k += 1
        else:  # a star from the first member plus the chain of neighbours
            for i in range(s + 1, e):
                out[k] = (np.uint64(members[s]) << np.uint64(32)) | np.uint64(members[i])
                out[k + 1] = (np.uint64(members[i - 1]) << np.uint64(32)) | np.uint64(members[i])
                k += 2
    return out[:k]


def candidate_pairs(keys: np.ndarray, ids: np.ndarray | None = None, all_pairs_max: int = 16) -> np.ndarray:
    """Distinct candidate pairs ``(i, j)``, ``i < j``, sharing a bucket in any band (n × 2, int64).

    ``ids`` maps rows of ``keys`` to document indices (default ``arange``; must be increasing).
    Buckets with more than ``all_pairs_max`` members yield a star from their first member plus the
    chain of neighbours instead of all pairs (clusters stay connected without quadratic cost).
    """
    n = keys.shape[0]
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    if n and ids.max() >= 2**32:
        raise ValueError("at most 2**32 documents per clustering")
    parts = []
    for k in range(keys.shape[1]):
        order = np.argsort(keys[:, k], kind="stable")
        sk = keys[order, k]
        edge = np.flatnonzero(sk[1:] != sk[:-1]) + 1
        starts = np.concatenate(([0], edge, [n])).astype(np.int64)
        sizes = np.diff(starts)
        multi = sizes > 1
        if not multi.any():
            continue
        # keep only buckets with >= 2 members; members stay in increasing doc order (stable sort)
        keep_rows = np.repeat(multi, sizes)
        members = ids[order[keep_rows]]
        new_starts = np.concatenate(([0], np.cumsum(sizes[multi]))).astype(np.int64)
        parts.append(_bucket_pairs(members, new_starts, int(all_pairs_max)))
    if not parts:
        return np.empty((0, 2), dtype=np.int64)
    packed = np.unique(np.concatenate(parts))
    return np.stack([(packed >> np.uint64(32)).astype(np.int64),
                     (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)], axis=1)


# -- distributed banding: buckets split by key partition, pairs merged later --------------------
def partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition (``0 .. partitions-1``) of 64-bit hash keys: ``fmix64(key) % partitions``."""
    h = np.asarray(keys, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return (h % np.uint64(partitions)).astype(np.int64)


def bucket_candidates(bands: np.ndarray, keys: np.ndarray, docs: np.ndarray, all_pairs_max: int = 16
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group entries ``(band, key, doc)`` into buckets; the reduce step of distributed LSH.

    Returns ``(pairs, big_members, big_sizes)``: the distinct packed pairs ``i << 32 | j`` of every
    bucket of 2 .. ``all_pairs_max`` members, and the members (increasing) of each bigger bucket,
    concatenated, with their sizes. :func:`merge_candidates` turns these, once the exact duplicates
    are known, into exactly the pairs of :func:`candidate_pairs` over the remaining documents.
    """
    docs = np.asarray(docs, dtype=np.int64)
    if len(docs) and docs.max() >= 2**32:
        raise ValueError("at most 2**32 documents per clustering")
    order = np.lexsort((docs, keys, bands))  # by band, then key, then document
    sb, sk, sd = bands[order], keys[order], docs[order]
    n = len(order)
    edge = np.flatnonzero((sk[1:] != sk[:-1]) | (sb[1:] != sb[:-1])) + 1
    starts = np.concatenate(([0], edge, [n])).astype(np.int64)
    sizes = np.diff(starts)
    group = np.repeat(np.arange(len(sizes)), sizes)
    small = (sizes > 1) & (sizes <= all_pairs_max)
    big = sizes > all_pairs_max
    members = sd[small[group]]
    pairs = _bucket_pairs(members, np.concatenate(([0], np.cumsum(sizes[small]))).astype(np.int64),
                          int(all_pairs_max)) if small.any() else np.empty(0, dtype=np.uint64)
    return np.unique(pairs), sd[big[group]], sizes[big].astype(np.int64)


def merge_candidates(pairs: Sequence[np.ndarray], big_members: Sequence[np.ndarray], big_sizes: Sequence[np.ndarray],
                     keep: np.ndarray, all_pairs_max: int = 16) -> np.ndarray:
    """Candidate pairs (n × 2, int64) from the outputs of :func:`bucket_candidates` of every partition.

    ``keep`` (bool per document) drops exact duplicates: pairs of small buckets touching a dropped
    document go; big buckets lose the dropped members and are paired again, so the result equals
    :func:`candidate_pairs` over the kept documents only.
    """
    parts = []
    for p in pairs:
        if len(p):
            i, j = (p >> np.uint64(32)).astype(np.int64), (p & np.uint64(0xFFFFFFFF)).astype(np.int64)
            parts.append(p[keep[i] & keep[j]])
    for members, sizes in zip(big_members, big_sizes, strict=True):
        if not len(sizes):
            continue
        ok = keep[members]
        new_sizes = np.add.reduceat(ok.astype(np.int64), np.concatenate(([0], np.cumsum(sizes)[:-1])))
        multi = new_sizes > 1
        group = np.repeat(np.arange(len(sizes)), sizes)
        sel = ok & multi[group]
        starts = np.concatenate(([0], np.cumsum(new_sizes[multi]))).astype(np.int64)
        parts.append(_bucket_pairs(members[sel], starts, int(all_pairs_max)))
    if not parts:
        return np.empty((0, 2), dtype=np.int64)
    packed = np.unique(np.concatenate(parts))
    return np.stack([(packed >> np.uint64(32)).astype(np.int64),
                     (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)], axis=1)


def exact_groups(hashes: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """``(doc, first)`` rows (int64) for every document whose 128-bit hash (n × 2) an earlier one has."""
    if not len(docs):
        return np.empty((0, 2), dtype=np.int64)
    docs = np.asarray(docs, dtype=np.int64)
    order = np.lexsort((docs, hashes[:, 1], hashes[:, 0]))
    sh, sd = hashes[order], docs[order]
    new = np.ones(len(sd), dtype=bool)
    new[1:] = (sh[1:] != sh[:-1]).any(axis=1)
    first = sd[np.flatnonzero(new)][np.cumsum(new) - 1]
    return np.stack([sd[~new], first[~new]], axis=1)


# -- verification and clustering --------------------------------------------------------------
def estimated_jaccard(sig: np.ndarray, pairs: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Share of equal signature values for each pair (rows of ``pairs`` index rows of ``sig``)."""
    out = np.empty(len(pairs), dtype=np.float64)
    for s in range(0, len(pairs), chunk):
        p = pairs[s:s + chunk]
        out[s:s + chunk] = (sig[p[:, 0]] == sig[p[:, 1]]).mean(axis=1)
    return out


def jaccard_sorted(x: np.ndarray, y: np.ndarray) -> float:
    """Exact Jaccard of two sorted arrays of distinct values (two empty sets: 1.0)."""
    if len(x) == 0 and len(y) == 0:
        return 1.0
    inter = len(np.intersect1d(x, y, assume_unique=True))
    return inter / (len(x) + len(y) - inter)


def jaccard_sets(a: Iterable, b: Iterable) -> float:
    """Exact Jaccard of two Python iterables taken as sets (reference implementation)."""
    sa, sb = set(a), set(b)
    return 1.0 if not sa and not sb else len(sa & sb) / len(sa | sb)


@numba.njit(cache=True)
def _find(parent: np.ndarray, x: int) -> int:
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:  # path compression
        nxt = parent[x]
        parent[x] = root
        x = nxt
    return root


@numba.njit(cache=True)
def _union_all(parent: np.ndarray, pairs: np.ndarray) -> None:
    for k in range(pairs.shape[0]):
        ra, rb = _find(parent, pairs[k, 0]), _find(parent, pairs[k, 1])
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb
    for x in range(parent.shape[0]):
        parent[x] = _find(parent, x)


def union_find_roots(n: int, pairs: np.ndarray) -> np.ndarray:
    """Cluster root of each of ``n`` items joined by ``pairs``: the smallest index in its cluster."""
    parent = np.arange(n, dtype=np.int64)
    if len(pairs):
        _union_all(parent, np.ascontiguousarray(pairs, dtype=np.int64))
    return parent


def first_occurrence(keys: np.ndarray) -> np.ndarray:
    """For rows of ``keys`` (n × k), the index of the first row equal to each row."""
    n = keys.shape[0]
    if n == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort(keys.T[::-1])  # stable: equal rows stay in index order
    sk = keys[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (sk[1:] != sk[:-1]).any(axis=1)
    group_first = order[np.flatnonzero(new)]
    group_id = np.cumsum(new) - 1
    first = np.empty(n, dtype=np.int64)
    first[order] = group_first[group_id]
    return first
