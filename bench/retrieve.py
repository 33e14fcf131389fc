"""Benchmark: cptkit's BM25 index vs bm25s (numba) and rank-bm25 on ≥ 100k real documents.

Corpus: the demo corpus (``cptkit demo-corpus``). It holds ~93k documents, fewer than the
100k asked for, so documents are split at blank lines into paragraphs (short neighbours merged
to ≥ 200 characters) until there are enough; the first ``--docs`` paragraphs (corpus order) are
indexed. Queries: one sentence (≥ 5 tokens) sampled per held-out paragraph (every 50th
paragraph is held out of the index), seeded. All systems get the same tokens (cptkit's default
tokenizer); every system runs in its own process, one thread, so peak RSS is its own.

    python bench/retrieve.py [--corpus DIR] [--docs 100000] [--queries 1000] [--rounds 7]
                             [--rank-bm25-docs 10000] [--rank-bm25-queries 300]

Search throughput is the best of ``--rounds`` runs per system, each in a fresh process (one
timed pass of all queries per k after a warm-up), the systems alternating round by round so
that a loaded machine penalizes both alike; medians are reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import table, write_section  # noqa: E402

HELD_OUT_EVERY = 50


def peak_mib() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss would carry over the parent's across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def paragraphs(text: str, min_chars: int = 200) -> list[str]:
    out: list[str] = []
    buf = ""
    for p in re.split(r"\n\s*\n", text):
        p = p.strip()
        if not p:
            continue
        buf = f"{buf}\n\n{p}" if buf else p
        if len(buf) >= min_chars:
            out.append(buf)
            buf = ""
    if buf:
        if out:
            out[-1] += "\n\n" + buf
        else:
            out.append(buf)
    return out


def load_corpus(corpus: Path, n_docs: int, n_queries: int, seed: int) -> tuple[list[str], list[str], dict]:
    """Indexed paragraphs and query sentences (from held-out paragraphs), plus provenance."""
    from cptkit.core.shards import iter_records, resolve_inputs
    from cptkit.text.tokenize import Tokenizer

    recs = list(iter_records(resolve_inputs(str(corpus))))
    paras = [p for r in recs for p in paragraphs(r["text"])]
    held = paras[::HELD_OUT_EVERY]
    docs = [p for i, p in enumerate(paras) if i % HELD_OUT_EVERY][:n_docs]
    if len(docs) < n_docs:
        raise SystemExit(f"only {len(docs)} paragraphs in {corpus}; need {n_docs}")
    rng = random.Random(seed)
    tok = Tokenizer()
    queries: list[str] = []
    for p in rng.sample(held, len(held)):
        sents = [s.strip() for s in re.split(r"(?<=[.!?。！？])\s*", p) if len(tok(s)) >= 5]
        if sents:
            queries.append(rng.choice(sents)[:300])
        if len(queries) == n_queries:
            break
    info = {"documents": len(recs), "paragraphs": len(paras), "held_out": len(held)}
    return docs, queries, info


# --- workers (each in its own process) ---------------------------------------------------

def _tokens(work: Path, docs: bool = True) -> tuple[list[list[str]], list[list[str]]]:
    from cptkit.text.tokenize import Tokenizer

    data = json.loads((work / "texts.json").read_text())
    tok = Tokenizer()
    return [tok(t) for t in data["docs"]] if docs else [], [tok(q) for q in data["queries"]]


def _query_sets(work: Path) -> dict[str, list[list[str]]]:
    """The query sets of ``texts.json``: ``""`` (``queries``) and ``"long_"`` (``long_queries``, if any)."""
    from cptkit.text.tokenize import Tokenizer

    data = json.loads((work / "texts.json").read_text())
    tok = Tokenizer()
    sets = {"": [tok(q) for q in data["queries"]]}
    if data.get("long_queries"):
        sets["long_"] = [tok(q) for q in data["long_queries"]]
    return sets


def _save_top(work: Path, system: str, prefix: str, k: int, docs: np.ndarray, scores: np.ndarray) -> None:
    if k == 10 and not prefix:
        np.save(work / f"{system}_top10.npy", docs)
    if k == 1000:
        np.save(work / f"{system}_{prefix}top1000.npy", docs)
        np.save(work / f"{system}_{prefix}top1000_scores.npy", scores)


def worker_cptkit(work: Path, ks: list[int]) -> dict:
    """Tokenize, build and save cptkit's index (build time, size, peak RSS)."""
    from cptkit.index.base import BM25Params
    from cptkit.index.bm25 import BM25Index

    t0 = time.perf_counter()
    docs, queries = _tokens(work)
    res: dict = {"tokenize_s": time.perf_counter() - t0, "rss_tokens_mib": rss_mib()}
    t0 = time.perf_counter()
    index = BM25Index.build(docs, BM25Params(idf="lucene", k1=1.5))  # bm25s runs at k1 = 1.5 too
    d = work / "cptkit_index"
    shutil.rmtree(d, ignore_errors=True)
    index.save(d)
    res["build_s"] = time.perf_counter() - t0
    res["size_mib"] = sum(f.stat().st_size for f in d.iterdir()) / 2**20
    del index, docs
    res.update(search_cptkit(work, ks, reference=True))
    res["peak_mib"] = peak_mib()
    return res


def search_cptkit(work: Path, ks: list[int], reference: bool = False) -> dict:
    """One timed pass of all queries per k (and query set) over the saved, memory-mapped index.

    ``reference``: also time the unblocked reference kernel (``search(reference=True)``) at the
    largest k and count the queries whose top-k (docs, scores, counts) it returns identically."""
    from cptkit.index.bm25 import BM25Index

    sets = _query_sets(work)
    index = BM25Index.load(work / "cptkit_index", mmap=True)
    index.search(sets[""][:2], 10)  # numba: load the compiled kernel
    res = {}
    for prefix, queries in sets.items():
        for k in ks:
            t0 = time.perf_counter()
            r = index.search(queries, k)
            res[f"{prefix}qps_{k}"] = len(queries) / (time.perf_counter() - t0)
            _save_top(work, "cptkit", prefix, k, r.docs, r.scores)
        if reference:
            k = max(ks)
            t0 = time.perf_counter()
            e = index.search(queries, k, reference=True)
            res[f"{prefix}qps_{k}_reference"] = len(queries) / (time.perf_counter() - t0)
            same = (e.docs == r.docs).all(axis=1) & (e.scores == r.scores).all(axis=1) & (e.counts == r.counts)
            res[f"{prefix}same_as_reference"] = float(same.mean())
    return res


def worker_cptkit_okapi_subset(work: Path, n_sub: int) -> dict:
    from cptkit.index.base import BM25Params
    from cptkit.index.bm25 import BM25Index

    docs, queries = _tokens(work)
    index = BM25Index.build(docs[:n_sub], BM25Params(idf="okapi"))
    np.save(work / "cptkit_okapi_top10.npy", index.search(queries, 10).docs)
    return {}


def worker_bm25s(work: Path, ks: list[int]) -> dict:
    """Build and save the bm25s index from the same tokens (build time, size, peak RSS)."""
    import bm25s
    from bm25s.tokenization import Tokenized

    t0 = time.perf_counter()
    docs, queries = _tokens(work)
    res: dict = {"tokenize_s": time.perf_counter() - t0}
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in d] for d in docs]
    res["rss_tokens_mib"] = rss_mib()
    t0 = time.perf_counter()
    model = bm25s.BM25(method="lucene", k1=1.5, b=0.75, backend="numba")
    model.index(Tokenized(ids=ids, vocab=vocab), show_progress=False)
    d = work / "bm25s_index"
    shutil.rmtree(d, ignore_errors=True)
    model.save(str(d), show_progress=False)
    res["build_s"] = time.perf_counter() - t0
    res["size_mib"] = sum(f.stat().st_size for f in d.iterdir()) / 2**20
    del model, ids, docs
    res.update(search_bm25s(work, ks))
    res["peak_mib"] = peak_mib()
    return res


def search_bm25s(work: Path, ks: list[int]) -> dict:
    """One timed pass of all queries per k (and query set) over bm25s' saved, memory-mapped index
    (numba, 1 thread)."""
    import bm25s

    sets = _query_sets(work)
    model = bm25s.BM25.load(str(work / "bm25s_index"), mmap=True)
    model.backend = "numba"
    res = {}
    for prefix, queries in sets.items():
        q_ids = [[model.vocab_dict[t] for t in q if t in model.vocab_dict] or [model.vocab_dict[""]] for q in queries]
        model.retrieve(q_ids[:2], k=10, show_progress=False, n_threads=1)  # numba warm-up
        for k in ks:
            t0 = time.perf_counter()
            docs_k, scores_k = model.retrieve(q_ids, k=k, show_progress=False, n_threads=1)
            res[f"{prefix}qps_{k}"] = len(queries) / (time.perf_counter() - t0)
            # bm25s fills up to k with zero-score documents: drop them (as cptkit returns none)
            scores_k = np.asarray(scores_k)
            _save_top(work, "bm25s", prefix, k, np.where(scores_k > 0, np.asarray(docs_k), -1), np.maximum(scores_k, 0))
    return res


def worker_rank_bm25(work: Path, n_sub: int, n_q: int) -> dict:
    from cptkit.index.base import BM25Params
    from cptkit.index.rank_bm25_backend import RankBM25Searcher

    docs, queries = _tokens(work)
    res: dict = {"rss_tokens_mib": rss_mib()}
    t0 = time.perf_counter()
    ref = RankBM25Searcher(docs[:n_sub], BM25Params(idf="okapi"))
    res["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = ref.search(queries[:n_q], 10)
    res["qps_10"] = n_q / (time.perf_counter() - t0)
    np.save(work / "rank_bm25_top10.npy", r.docs)
    res["peak_mib"] = peak_mib()
    return res


def run_worker(work: Path, name: str, *args: str) -> dict:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, __file__, "--worker", name, "--work", str(work), *args],
                       capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"worker {name} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def identical(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Shares of queries whose top-k lists (-1 = no document) are identical, and identical as sets."""
    lists = float((a == b).all(axis=1).mean())
    sets = float(np.mean([set(x[x >= 0].tolist()) == set(y[y >= 0].tolist()) for x, y in zip(a, b, strict=True)]))
    return lists, sets


def same_scores(a: np.ndarray, b: np.ndarray, scale: float, rtol: float = 1e-5) -> float:
    """Share of queries whose score lists agree: ``a / scale`` vs ``b`` within ``rtol`` (float32 rounding)."""
    return float(np.isclose(a / scale, b, rtol=rtol, atol=0).all(axis=1).mean())


def overlap(a: np.ndarray, b: np.ndarray, k: int = 10) -> float:
    """Mean |top-k(a) ∩ top-k(b)| / |top-k(b)| over queries with at least one hit in b."""
    vals = []
    for x, y in zip(a, b, strict=True):
        ys = {int(v) for v in y[:k] if v >= 0}
        if ys:
            vals.append(len({int(v) for v in x[:k] if v >= 0} & ys) / len(ys))
    return float(np.mean(vals))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=None, help="demo corpus dir (built if missing)")
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rank-bm25-docs", type=int, default=10_000)
    ap.add_argument("--rank-bm25-queries", type=int, default=300)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cptkit-bench-retrieve"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=7, help="search runs per system (best is reported)")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = args.work
    ks = [10, 1000]

    if args.worker:
        fn = {"cptkit": lambda: worker_cptkit(work, ks),
              "cptkit_search": lambda: search_cptkit(work, ks),
              "bm25s_search": lambda: search_bm25s(work, ks),
              "cptkit_okapi": lambda: worker_cptkit_okapi_subset(work, args.rank_bm25_docs),
              "bm25s": lambda: worker_bm25s(work, ks),
              "rank_bm25": lambda: worker_rank_bm25(work, args.rank_bm25_docs, args.rank_bm25_queries)}
        print(json.dumps(fn[args.worker]()))
        return

    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or work / "demo"
    if not (corpus / "_SUCCESS").exists() and args.corpus is None:
        print(f"building the demo corpus into {corpus} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "cptkit.cli", "demo-corpus", "-q", "--out", str(corpus)], check=True)
    docs, queries, info = load_corpus(corpus, args.docs, args.queries, args.seed)
    (work / "texts.json").write_text(json.dumps({"docs": docs, "queries": queries}, ensure_ascii=False))
    print(f"{len(docs)} docs, {len(queries)} queries ({info})", file=sys.stderr)

    ours = run_worker(work, "cptkit")
    print("cptkit", ours, file=sys.stderr)
    theirs = run_worker(work, "bm25s")
    print("bm25s", theirs, file=sys.stderr)
    # Search timings: best of --rounds fresh processes per system, alternating which goes first,
    # so that load from other users of the machine hits both systems alike.
    runs: dict[str, list[dict]] = {"cptkit": [dict(ours)], "bm25s": [dict(theirs)]}
    for r in range(args.rounds - 1):
        for name in (("cptkit", "bm25s") if r % 2 else ("bm25s", "cptkit")):
            runs[name].append(run_worker(work, f"{name}_search"))
    for name, res in (("cptkit", ours), ("bm25s", theirs)):
        for k in ks:
            vals = [x[f"qps_{k}"] for x in runs[name]]
            res[f"qps_{k}"], res[f"qps_{k}_median"] = max(vals), float(np.median(vals))
        print(name, "q/s per round", [[round(x[f"qps_{k}"]) for k in ks] for x in runs[name]], file=sys.stderr)
    run_worker(work, "cptkit_okapi", "--rank-bm25-docs", str(args.rank_bm25_docs))
    ref = run_worker(work, "rank_bm25", "--rank-bm25-docs", str(args.rank_bm25_docs),
                     "--rank-bm25-queries", str(args.rank_bm25_queries))
    print("rank_bm25", ref, file=sys.stderr)

    ov_bm25s = overlap(np.load(work / "cptkit_top10.npy"), np.load(work / "bm25s_top10.npy"))
    nq_ref = args.rank_bm25_queries
    ov_ref = overlap(np.load(work / "cptkit_okapi_top10.npy")[:nq_ref], np.load(work / "rank_bm25_top10.npy"))
    n_sub = args.rank_bm25_docs
    rows = [
        ["cptkit (numba, mmap)", f"{len(docs):,}", ours["build_s"], ours["size_mib"], ours["peak_mib"],
         ours["qps_10"], ours["qps_10_median"], ours["qps_1000"], ours["qps_1000_median"],
         f"{ov_bm25s:.4f} vs bm25s"],
        ["bm25s 0.3 (numba, mmap)", f"{len(docs):,}", theirs["build_s"], theirs["size_mib"], theirs["peak_mib"],
         theirs["qps_10"], theirs["qps_10_median"], theirs["qps_1000"], theirs["qps_1000_median"], "—"],
        ["rank-bm25 (okapi)", f"{n_sub:,} (subset)", ref["build_s"], "— (in memory)", ref["peak_mib"],
         ref["qps_10"], "—", "—", "—", f"cptkit okapi: {ov_ref:.4f}"],
    ]
    header = ["system", "docs", "index build s", "index MiB", "peak RSS MiB", "q/s top-10 (best)", "(median)",
              "q/s top-1000 (best)", "(median)",
              "top-10 overlap"]
    body = (
        f"{table(header, rows)}\n\n"
        f"Ratios (cptkit / bm25s): build {theirs['build_s'] / ours['build_s']:.2f}x faster, "
        f"top-10 q/s {ours['qps_10'] / theirs['qps_10']:.2f}x, top-1000 q/s {ours['qps_1000'] / theirs['qps_1000']:.2f}x "
        f"(best of {args.rounds}; medians {ours['qps_10_median'] / theirs['qps_10_median']:.2f}x and "
        f"{ours['qps_1000_median'] / theirs['qps_1000_median']:.2f}x), "
        f"index size {ours['size_mib'] / theirs['size_mib']:.2f}x.\n\n"
        f"Corpus: the demo corpus ({info['documents']:,} documents) split at blank lines into "
        f"{info['paragraphs']:,} paragraphs (short ones merged to ≥ 200 characters), because it has fewer than "
        f"100k documents; every {HELD_OUT_EVERY}th paragraph is held out and the first {len(docs):,} others are "
        f"indexed. Queries: {len(queries):,} sentences (≥ 5 tokens) sampled from held-out paragraphs "
        f"(seed {args.seed}), English and Chinese. Same tokens for every system (cptkit default tokenizer: "
        f"lowercase, split on `\\W+`, CJK bigrams; tokenization ~{ours['tokenize_s']:.1f} s, not in build times). "
        f"cptkit and bm25s: IDF `lucene`, k1 = 1.5, b = 0.75, one thread each, searched from the saved, "
        f"memory-mapped index, all {len(queries):,} queries in one call per k. Search q/s: best (and median) of "
        f"{args.rounds} runs per system, each a fresh process timing one pass per k after a warm-up, the two "
        f"systems alternating run by run (the machine is shared, so single runs are noisy). "
        f"rank-bm25 is timed once; top-10 overlap of cptkit vs bm25s is over all queries, counting only documents with a score > 0 (bm25s pads to k with zero-score documents). rank-bm25 (the reference, "
        f"pure Python): `BM25Okapi` on the first {n_sub:,} documents and {nq_ref:,} queries; its row's overlap "
        f"is cptkit with `idf=okapi` on the same subset. Peak RSS is per process and includes the tokenized "
        f"corpus held in memory (~{ours['rss_tokens_mib']:,.0f} MiB after tokenization). "
        f"Index MiB: postings only (cptkit's `retrieve` step also stores the documents)."
    )
    print(body)
    if not args.no_report:
        cmd = "python bench/retrieve.py" + (f" --corpus {args.corpus}" if args.corpus else "") + (
            f" --rounds {args.rounds}" if args.rounds != 7 else "")
        write_section("retrieve", "retrieve: BM25 index and search (cptkit vs bm25s vs rank-bm25)", cmd, body)


if __name__ == "__main__":
    main()
