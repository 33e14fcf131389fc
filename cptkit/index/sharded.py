"""A sharded BM25 index: shards built by parallel jobs, searched with global term statistics.

Layout: ``ROOT/shard-IIIII-of-NNNNN/`` is an ordinary index directory (:mod:`cptkit.index.store`)
over the corpus files ``f`` with ``f % N == I`` (files in the order the corpus spec resolves
to). Its ``index.json`` adds ``shard: {index, count, files}`` and, per source file, its
position in the whole corpus (``file_index``) and document count (``docs``).

Searching merges the statistics of all shards first — document frequencies (summed per term
over the shards' vocabularies), ``N`` and the total length (so ``avgdl``) — and rescores every
shard's postings with them, so each posting's score is bit-identical to the single index's
over the same corpus. A query is then fanned out to every shard (threads: the kernel releases
the GIL) and the per-shard top-k lists are merged by score, then global corpus position
(file order, then line order): the single index's ranking, scores and tie order.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.index.base import BM25Params, Searcher, SearchResult, idf, term_weight
from cptkit.index.bm25 import BM25Index
from cptkit.index.store import DocStore, OpenIndex, is_finished

SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})$")


def shard_dir(root: str | Path, index: int, count: int) -> Path:
    return Path(root) / f"shard-{index:05d}-of-{count:05d}"


def is_sharded(root: str | Path) -> bool:
    """Whether ``root`` holds shard directories (finished or not) rather than one index."""
    r = Path(root)
    return r.is_dir() and not is_finished(r) and any(SHARD_RE.match(p.name) for p in r.iterdir() if p.is_dir())


def shard_files(n_files: int, index: int, count: int) -> list[int]:
    """Corpus file positions that shard ``index`` of ``count`` indexes (round-robin, as job arrays slice)."""
    return list(range(index, n_files, count))


def find_shards(root: str | Path) -> list[Path]:
    """The shard directories of ``root`` in shard order; every shard must be finished."""
    r = Path(root)
    found: dict[int, int] = {}
    for p in r.iterdir():
        m = SHARD_RE.match(p.name)
        if m and p.is_dir():
            found[int(m.group(1))] = int(m.group(2))
    if not found:
        raise CptkitError(f"{r}: no shard-IIIII-of-NNNNN directories here")
    counts = set(found.values())
    if len(counts) != 1:
        raise CptkitError(f"{r}: shards of different counts {sorted(counts)}; remove the stale ones")
    n = counts.pop()
    missing = [i for i in range(n) if i not in found or not is_finished(shard_dir(r, i, n))]
    if missing:
        raise CptkitError(f"{r}: {len(missing)} of {n} shards not built yet (first missing: shard {missing[0]}); "
                          f"run retrieve-index with shard.index={missing[0]} shard.count={n}")
    return [shard_dir(r, i, n) for i in range(n)]


def merge_stats(shards: list[BM25Index]) -> tuple[dict[str, int], int, int]:
    """Global ``(df per term, N, total length in tokens)`` of a list of shard indexes.

    Terms are ordered by first appearance over the shards in order (deterministic)."""
    gid: dict[str, int] = {}
    for s in shards:
        for t in s.vocab:
            if t not in gid:
                gid[t] = len(gid)
    df = np.zeros(len(gid), dtype=np.int64)
    for s in shards:
        ids = np.fromiter((gid[t] for t in s.vocab), dtype=np.int64, count=len(s.vocab))
        np.add.at(df, ids, s.df)
    return dict(zip(gid, df.tolist(), strict=True)), sum(s.n_docs for s in shards), \
        sum(int(np.asarray(s.doc_len, dtype=np.int64).sum()) for s in shards)


def global_scores(shard: BM25Index, global_idf: dict[str, float] | np.ndarray, avgdl: float,
                  params: BM25Params) -> np.ndarray:
    """A shard's posting scores under global statistics (``global_idf`` per shard term id, or by term).

    The same arithmetic as :meth:`BM25Index.compute_scores`, so equal to the single index's."""
    if isinstance(global_idf, dict):
        global_idf = np.fromiter((global_idf[t] for t in shard.vocab), dtype=np.float64, count=len(shard.vocab))
    w = term_weight(shard.post_tf, np.asarray(shard.doc_len)[shard.post_doc], avgdl, params)
    w *= np.repeat(global_idf, shard.df)
    return w.astype(shard.dtype, copy=False)


def globalize(shards: list[BM25Index], params: BM25Params) -> list[BM25Index]:
    """Shard indexes rescored with the merged statistics (see the module docstring)."""
    df, n_docs, total = merge_stats(shards)
    terms = list(df)
    idf_all = idf(np.fromiter(df.values(), dtype=np.int64, count=len(df)), n_docs, params)
    by_term = dict(zip(terms, idf_all.tolist(), strict=True))
    avgdl = float(total / n_docs) if n_docs else 0.0
    out = []
    for s in shards:
        g = np.fromiter((by_term[t] for t in s.vocab), dtype=np.float64, count=len(s.vocab))
        scores = global_scores(s, g, avgdl, params) if n_docs else np.zeros(s.post_doc.size, s.dtype)
        gi = BM25Index(s.vocab, s.indptr, s.post_doc, s.post_tf, scores, s.doc_len, params, s.dtype)
        gi.positive = g > 0
        gi.avgdl = avgdl
        out.append(gi)
    return out


class ShardedSearcher(Searcher):
    """Fan a batch of queries out to every shard and merge the per-shard top-k.

    ``global_ids[s][i]`` is shard ``s``'s document ``i``'s position in the whole corpus; results
    carry those positions, ranked by score descending, then position ascending."""

    def __init__(self, shards: list[BM25Index], global_ids: list[np.ndarray], params: BM25Params,
                 threads: int = 1):
        self.shards, self.global_ids, self.params = shards, global_ids, params
        self.n_docs = sum(s.n_docs for s in shards)
        self.threads = max(int(threads), 1)

    def search(self, queries: list[list[str]], k: int) -> SearchResult:
        k = max(int(k), 1)
        if self.threads > 1 and len(self.shards) > 1:
            with ThreadPoolExecutor(min(self.threads, len(self.shards))) as ex:
                parts = list(ex.map(lambda s: s.search(queries, k), self.shards))
        else:
            parts = [s.search(queries, k) for s in self.shards]
        return merge_topk(parts, self.global_ids, k)

    def get_scores(self, query: list[str]) -> np.ndarray:
        out = np.zeros(self.n_docs, dtype=np.float64)
        for s, g in zip(self.shards, self.global_ids, strict=True):
            out[g] = s.get_scores(query)
        return out


def merge_topk(parts: list[SearchResult], global_ids: list[np.ndarray], k: int) -> SearchResult:
    """Merge per-shard top-k results (shard-local doc indexes) into the global top-k."""
    nq = parts[0].docs.shape[0] if parts else 0
    docs = np.full((nq, k), -1, dtype=np.int64)
    scores = np.zeros((nq, k), dtype=np.float64)
    counts = np.zeros(nq, dtype=np.int64)
    for q in range(nq):
        d = np.concatenate([g[p.docs[q, :p.counts[q]]] for p, g in zip(parts, global_ids, strict=True)])
        s = np.concatenate([p.scores[q, :p.counts[q]] for p in parts])
        order = np.lexsort((d, -s))[:k]
        n = order.size
        docs[q, :n], scores[q, :n], counts[q] = d[order], s[order], n
    return SearchResult(docs, scores, counts)


class ShardedDocStore:
    """The documents of all shards, addressed by global corpus position."""

    def __init__(self, stores: list[DocStore], global_ids: list[np.ndarray]):
        self.stores = stores
        n = sum(len(s) for s in stores)
        self.shard_of = np.empty(n, dtype=np.int32)
        self.local_of = np.empty(n, dtype=np.int64)
        for i, g in enumerate(global_ids):
            self.shard_of[g] = i
            self.local_of[g] = np.arange(g.size)

    def __len__(self) -> int:
        return int(self.shard_of.size)

    def raw(self, i: int) -> bytes:
        return self.stores[self.shard_of[i]].raw(int(self.local_of[i]))

    def record(self, i: int) -> Record:
        return self.stores[self.shard_of[i]].record(int(self.local_of[i]))

    def close(self) -> None:
        for s in self.stores:
            s.close()


class OpenShardedIndex:
    """A finished sharded index opened for search: the same surface as :class:`OpenIndex`."""

    def __init__(self, root: str | Path, threads: int = 1):
        self.dir = Path(root)
        self.parts = [OpenIndex(d) for d in find_shards(self.dir)]
        metas = [p.meta for p in self.parts]
        first = metas[0]
        for p in self.parts[1:]:
            for key in ("tokenizer", "params", "text_field", "dtype"):
                if p.meta[key] != first[key]:
                    raise CptkitError(f"{p.dir}: {key} {p.meta[key]!r} differs from {self.parts[0].dir}'s "
                                      f"{first[key]!r}; rebuild the shards with one config")
        self.tokenizer = self.parts[0].tokenizer
        self.threads = threads
        self.global_ids = self._global_ids(metas)
        self.docs = ShardedDocStore([p.docs for p in self.parts], self.global_ids)
        self.meta = dict(first)
        self.meta.update({
            "docs": sum(m["docs"] for m in metas),
            "postings": sum(m["postings"] for m in metas),
            "size_bytes": sum(m["size_bytes"] for m in metas),
            "sources": sorted((s for m in metas for s in m["sources"]), key=lambda s: s["file_index"]),
            "shards": len(self.parts),
        })
        self._merged: dict[BM25Params, list[BM25Index]] = {}
        base = self._globalized(BM25Params(**first["params"]))
        self.meta["terms"] = len(merge_stats([p.bm25 for p in self.parts])[0])
        self.meta["avgdl"] = base[0].avgdl

    def _global_ids(self, metas: list[dict]) -> list[np.ndarray]:
        n_files = {m["shard"]["files"] for m in metas}
        if len(n_files) != 1:
            raise CptkitError(f"{self.dir}: shards were built from different corpora ({sorted(n_files)} files)")
        files = {s["file_index"]: s["docs"] for m in metas for s in m["sources"]}
        total = n_files.pop()
        if sorted(files) != list(range(total)):
            raise CptkitError(f"{self.dir}: the shards do not cover the corpus' {total} files exactly once")
        start = np.zeros(total + 1, dtype=np.int64)
        np.cumsum([files[f] for f in range(total)], out=start[1:])
        return [np.concatenate([np.arange(start[s["file_index"]], start[s["file_index"] + 1]) for s in m["sources"]]
                               or [np.zeros(0, np.int64)]).astype(np.int64) for m in metas]

    @property
    def n_docs(self) -> int:
        return len(self.docs)

    def _globalized(self, params: BM25Params) -> list[BM25Index]:
        if params not in self._merged:
            self._merged[params] = globalize([p.bm25 for p in self.parts], params)
        return self._merged[params]

    def searcher(self, backend: str = "bm25", params: BM25Params | None = None) -> Searcher:
        if backend != "bm25":
            raise CptkitError(f"a sharded index is searched with retrieve.backend=bm25, not {backend!r}")
        params = params or BM25Params(**self.meta["params"])
        return ShardedSearcher(self._globalized(params), self.global_ids, params, self.threads)

    def close(self) -> None:
        for p in self.parts:
            p.close()
