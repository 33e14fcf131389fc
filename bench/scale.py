"""How dedup, retrieve and build-mix scale: 10k, 100k and 1M real paragraphs, time, peak RSS and
output size, log-log plot and growth exponents; the peers side by side at the largest size.

Corpus: ``bench/scale_corpus.py`` (paragraphs of every Debian documentation, dictionary and
man-page package it lists, shuffled with a fixed seed); the first ``n`` paragraphs are size ``n``.
Queries: 1,000 paragraphs from the end of the corpus (never indexed), first 12 words each.

Every step runs as the command a user types (``cptkit dedup``, ``cptkit retrieve-index`` then
``cptkit retrieve ... retrieve.top_k=1000``, ``cptkit build-mix``) under ``/usr/bin/time``: wall
seconds and the process's peak RSS. Disk is the output directory's size (the index for retrieve).
The growth exponent is the slope of log(time) (and log(RSS above the interpreter's baseline)) on
log(n) between the two largest sizes: 1.0 is linear.

Peers at the largest size, each in its own process on the same paragraphs:
* retrieve: bm25s (numba backend, lucene, same tokens) vs cptkit's index, build and top-1000
  search of the same 1,000 queries (``bench/retrieve.py``'s workers);
* dedup: rensa (RMinHashLSH, 16 bands) and datasketch (MinHashLSH, ``update_batch``) vs the
  cptkit command end to end; datasketch runs on ``--datasketch-docs`` and is extrapolated
  linearly (it is the slowest by far).

Long queries (the issue's expanded questions): the first 30-60 words of 1,000 other never-indexed
paragraphs of >= 60 words; the retrieve peers time both sets, top-10 and top-1000, best of
``--rounds`` fresh processes per system, and count identical top-1000 lists.
``--retrieve-only`` runs just that comparison at the largest size (section ``scale-retrieve``).

    python bench/scale.py [--sizes 10000,100000,1000000] [--work /tmp/cptkit-bench-scale]
    python bench/scale.py --retrieve-only --sizes 1000000 [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import table, write_section  # noqa: E402

CORPUS = Path("~/.cache/cptkit/scale/paragraphs").expanduser()
BASE_MIB = 0.0  # RSS of a bare `cptkit --version` (set in main)
N_QUERIES = 1000


def cptkit_cmd() -> list[str]:
    return [sys.executable, "-c", "from cptkit.cli import main; main()"]


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a command run under /usr/bin/time."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return wall, int(p.stderr.strip().splitlines()[-1]) / 1024


def du_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def read_corpus(n_total: int) -> list[dict]:
    out: list[dict] = []
    for shard in sorted(CORPUS.glob("part-*.jsonl.gz")):
        with gzip.open(shard, "rt", encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f)
        if len(out) >= n_total:
            break
    return out


def write_subset(docs: list[dict], d: Path, per_shard: int = 50_000) -> None:
    if (d / "_SUCCESS").exists():
        return
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for i in range(0, len(docs), per_shard):
        with gzip.open(d / f"part-{i // per_shard:05d}.jsonl.gz", "wt", encoding="utf-8", compresslevel=1) as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in docs[i:i + per_shard])
    (d / "_SUCCESS").write_text("")


def run_size(n: int, sub: Path, queries: Path, work: Path) -> dict[str, dict]:
    res: dict[str, dict] = {}
    q = ["--quiet"]
    for name in ("dedup", "index", "search", "mix"):
        shutil.rmtree(work / name, ignore_errors=True)
    s, m = timed(cptkit_cmd() + ["dedup", "--in", str(sub), "--out", str(work / "dedup"), *q])
    res["dedup"] = {"s": s, "rss": m, "disk": du_mib(work / "dedup")}
    s, m = timed(cptkit_cmd() + ["retrieve-index", "--corpus", str(sub), "--out", str(work / "index"), *q])
    res["retrieve index"] = {"s": s, "rss": m, "disk": du_mib(work / "index")}
    s, m = timed(cptkit_cmd() + ["retrieve", "--queries", str(queries), "--index", str(work / "index"),
                                 "--out", str(work / "search"), "retrieve.top_k=1000", *q])
    res["retrieve top-1000"] = {"s": s, "rss": m, "disk": du_mib(work / "search")}
    s, m = timed(cptkit_cmd() + ["build-mix", "--in", str(sub), "--out", str(work / "mix"), "mix=scale",
                                 f"mix.budget_tokens={16 * n}", "tokenizer=smollm2", *q])
    res["build-mix"] = {"s": s, "rss": m, "disk": du_mib(work / "mix")}
    print(n, json.dumps(res), file=sys.stderr, flush=True)
    return res


def exponent(ns: list[int], ys: list[float]) -> float:
    return float(np.log(ys[-1] / ys[-2]) / np.log(ns[-1] / ns[-2])) if len(ns) > 1 and ys[-2] > 0 else float("nan")


def plot(ns: list[int], results: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, label) in zip(axes, (("s", "wall seconds"), ("rss", "peak RSS, MiB"), ("disk", "output, MiB")),
                                strict=True):
        for step in results[ns[0]]:
            ax.loglog(ns, [results[n][step][key] for n in ns], "o-", label=step)
        ax.set_xlabel("documents")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def long_queries(recs: list[dict], n: int = N_QUERIES) -> list[str]:
    """Expanded-question-like queries: the first 30 + i mod 31 words (30-60) of the i-th paragraph
    with >= 60 words among ``recs`` (never indexed)."""
    out: list[str] = []
    for r in recs:
        w = r["text"].split()
        if len(w) >= 60:
            out.append(" ".join(w[:30 + len(out) % 31]))
            if len(out) == n:
                break
    return out


def retrieve_peers(docs: list[dict], qtexts: list[str], ltexts: list[str], work: Path,
                   rounds: int) -> tuple[list[list], dict, dict]:
    """cptkit vs bm25s (``bench/retrieve.py``'s workers, each in its own process, one thread):
    build, then search q/s at top-10 and top-1000 for short and long queries, best of ``rounds``
    fresh processes per system alternating; identity of the top-1000 lists."""
    from bench import retrieve as br

    rw = work / "peers"
    rw.mkdir(parents=True, exist_ok=True)
    (rw / "texts.json").write_text(json.dumps({"docs": [d["text"] for d in docs], "queries": qtexts,
                                               "long_queries": ltexts}, ensure_ascii=False))
    ours = br.run_worker(rw, "cptkit")
    print("cptkit", ours, file=sys.stderr, flush=True)
    theirs = br.run_worker(rw, "bm25s")
    print("bm25s", theirs, file=sys.stderr, flush=True)
    ident = {p: br.identical(np.load(rw / f"cptkit_{p}top1000.npy"), np.load(rw / f"bm25s_{p}top1000.npy"))
             for p in ("", "long_")}
    # bm25s (lucene) omits the factor k1 + 1 = 2.5 of every score
    same_s = {p: br.same_scores(np.load(rw / f"cptkit_{p}top1000_scores.npy"),
                                np.load(rw / f"bm25s_{p}top1000_scores.npy"), 2.5) for p in ("", "long_")}
    runs: dict[str, list[dict]] = {"cptkit": [dict(ours)], "bm25s": [dict(theirs)]}
    for r in range(rounds - 1):
        for name in (("cptkit", "bm25s") if r % 2 else ("bm25s", "cptkit")):
            runs[name].append(br.run_worker(rw, f"{name}_search"))
    for name, res in (("cptkit", ours), ("bm25s", theirs)):
        for key in [k for k in res if k.startswith(("qps_", "long_qps_")) and not k.endswith("_reference")]:
            vals = [x[key] for x in runs[name]]
            res[key], res[key + "_median"] = max(vals), float(np.median(vals))
        print(name, "q/s per round", [{k: round(v) for k, v in x.items() if "qps" in k} for x in runs[name]],
              file=sys.stderr, flush=True)
    rows = [["index build, s (tokenization excluded)", ours["build_s"], theirs["build_s"],
             theirs["build_s"] / ours["build_s"]]]
    for p, label in (("", "short (12 words)"), ("long_", "long (30-60 words)")):
        for k in (10, 1000):
            key = f"{p}qps_{k}"
            rows.append([f"{label}: top-{k:,} q/s, best (median)",
                         f"{ours[key]:,.1f} ({ours[key + '_median']:,.1f})",
                         f"{theirs[key]:,.1f} ({theirs[key + '_median']:,.1f})",
                         f"{ours[key] / theirs[key]:.2f} ({ours[key + '_median'] / theirs[key + '_median']:.2f})"])
        rows.append([f"{label}: top-1,000 q/s, cptkit unblocked reference kernel, one pass",
                     ours[f"{p}qps_1000_reference"], "—", f"{ours[f'{p}qps_1000_reference'] / theirs[f'{p}qps_1000']:.2f}"])
        rows.append([f"{label}: top-1,000 identical to the reference kernel (docs, scores)",
                     f"{ours[f'{p}same_as_reference']:.4f}", "—", "—"])
        rows.append([f"{label}: top-1,000 lists identical to bm25s (as sets)",
                     f"{ident[p][0]:.4f} ({ident[p][1]:.4f})", "—", "—"])
        rows.append([f"{label}: top-1,000 score lists equal to bm25s' × 2.5 (rtol 1e-5)",
                     f"{same_s[p]:.4f}", "—", "—"])
    rows += [["peak RSS, MiB", ours["peak_mib"], theirs["peak_mib"], theirs["peak_mib"] / ours["peak_mib"]],
             ["index size, MiB", ours["size_mib"], theirs["size_mib"], theirs["size_mib"] / ours["size_mib"]]]
    return rows, ours, theirs


def peers(docs: list[dict], qtexts: list[str], ltexts: list[str], work: Path, ds_docs: int,
          ours_dedup: dict, rounds: int) -> list[list]:
    """bm25s vs cptkit's index (bench/retrieve.py workers) and rensa/datasketch vs cptkit dedup."""
    from bench import dedup as bd

    _, ours, theirs = retrieve_peers(docs, qtexts, ltexts, work, rounds)
    rows = [["retrieve: index build, s", ours["build_s"], theirs["build_s"], "bm25s", theirs["build_s"] / ours["build_s"]],
            ["retrieve: top-1000, q/s", ours["qps_1000"], theirs["qps_1000"], "bm25s", ours["qps_1000"] / theirs["qps_1000"]],
            ["retrieve: top-1000, long queries, q/s", ours["long_qps_1000"], theirs["long_qps_1000"], "bm25s",
             ours["long_qps_1000"] / theirs["long_qps_1000"]],
            ["retrieve: peak RSS, MiB", ours["peak_mib"], theirs["peak_mib"], "bm25s", theirs["peak_mib"] / ours["peak_mib"]],
            ["retrieve: index size, MiB", ours["size_mib"], theirs["size_mib"], "bm25s", theirs["size_mib"] / ours["size_mib"]]]
    _, rs, _, rpeak = bd.measure(bd.run_rensa, docs)
    rows.append(["dedup: seconds", ours_dedup["s"], rs, "rensa", rs / ours_dedup["s"]])
    rows.append(["dedup: peak RSS, MiB", ours_dedup["rss"], rpeak / 2**20, "rensa (above start)", rpeak / 2**20 / ours_dedup["rss"]])
    sub = docs[:ds_docs]
    _, ds, _, _ = bd.measure(bd.run_datasketch, sub, True)
    ds_full = ds * len(docs) / len(sub)
    rows.append([f"dedup: seconds (datasketch: {len(sub):,} docs × {len(docs) / len(sub):.0f})",
                 ours_dedup["s"], ds_full, "datasketch", ds_full / ours_dedup["s"]])
    return rows


def main_retrieve(args: argparse.Namespace, docs: list[dict], qtexts: list[str], ltexts: list[str]) -> None:
    """``--retrieve-only``: the BM25 peers table at the largest size, its own section."""
    load = os.getloadavg()
    rows, ours, _ = retrieve_peers(docs, qtexts, ltexts, args.work, args.rounds)
    load_end = os.getloadavg()
    body = (f"{len(docs):,} paragraphs of the scale corpus (`bench/scale_corpus.py`, the first {len(docs):,}); "
            f"short queries: {len(qtexts):,} held-out paragraphs' first 12 words (as in the scale section); "
            f"long queries: the first 30-60 words of {len(ltexts):,} other never-indexed paragraphs of >= 60 "
            f"words (like questions expanded with a generated passage). Same tokens for both systems (cptkit's "
            f"default tokenizer), IDF lucene, k1 1.5, b 0.75, one thread each, searched from the saved memory-"
            f"mapped index, all queries of a set in one call per k. Build: tokenized corpus to saved index "
            f"(tokenization excluded; bm25s also gets its token ids mapped outside its timer). Search q/s: "
            f"best (median) of {args.rounds} fresh processes per system, alternating. Identity: top-1,000 "
            f"lists counting only documents with score > 0 (bm25s pads with zero-score documents); bm25s scores "
            f"are ours / (k1 + 1) up to float32 rounding, so near-ties can swap. Ratio > 1: cptkit is better. "
            f"Load average (1 min) at start {load[0]:.2f}, at end {load_end[0]:.2f} on this shared machine.\n\n"
            + table(["measure", "cptkit", "bm25s 0.3.16 (numba)", "ratio"], rows) + "\n")
    print(body)
    if not args.no_report:
        write_section("scale-retrieve", f"retrieve at {len(docs):,} documents: cptkit vs bm25s, short and long queries",
                      f"python bench/scale.py --retrieve-only --sizes {len(docs)} --rounds {args.rounds}", body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cptkit-bench-scale"))
    ap.add_argument("--datasketch-docs", type=int, default=50_000)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="retrieve peers: search runs per system (best reported)")
    ap.add_argument("--retrieve-only", action="store_true",
                    help="only the cptkit vs bm25s retrieve table at the largest size (section scale-retrieve)")
    args = ap.parse_args()
    ns = [int(x) for x in args.sizes.split(",")]
    if not (CORPUS / "_sources.json").exists():
        raise SystemExit(f"build the corpus first: python bench/scale_corpus.py --out {CORPUS}")
    allrecs = read_corpus(max(ns) + N_QUERIES)
    if len(allrecs) < max(ns) + N_QUERIES:
        raise SystemExit(f"{CORPUS} holds {len(allrecs):,} paragraphs, fewer than {max(ns) + N_QUERIES:,}")
    qrecs = allrecs[-N_QUERIES:]
    qtexts = [" ".join(r["text"].split()[:12]) for r in qrecs]
    ltexts = long_queries(allrecs[max(ns):-N_QUERIES])
    if args.retrieve_only:
        args.work.mkdir(parents=True, exist_ok=True)
        return main_retrieve(args, allrecs[:max(ns)], qtexts, ltexts)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    queries = work / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "text": t}, ensure_ascii=False) + "\n"
                               for i, t in enumerate(qtexts)))
    global BASE_MIB
    BASE_MIB = timed([sys.executable, "-c", "import cptkit.cli"])[1]
    results: dict[int, dict] = {}
    for n in ns:
        sub = work / f"docs{n}"
        write_subset(allrecs[:n], sub)
        results[n] = run_size(n, sub, queries, work / f"run{n}")
    steps = list(results[ns[0]])
    header = ["step"] + [f"{n:,}: s / MiB RSS / MiB out" for n in ns] + ["time exp.", "RSS exp."]
    rows = [[s] + [f"{results[n][s]['s']:.1f} / {results[n][s]['rss']:,.0f} / {results[n][s]['disk']:,.0f}" for n in ns]
            + [f"{exponent(ns, [results[n][s]['s'] for n in ns]):.2f}",
               f"{exponent(ns, [max(results[n][s]['rss'] - BASE_MIB, 1.0) for n in ns]):.2f}"] for s in steps]
    png = ROOT / "docs" / "scale.png"
    plot(ns, results, png)
    sources = json.loads((CORPUS / "_sources.json").read_text())
    body = (f"Corpus: {sources['paragraphs']:,} paragraphs ({sources['characters'] / 1e6:,.0f} M characters) of "
            f"{sum(1 for k, v in sources.items() if k not in ('paragraphs', 'characters') and v)} Debian packages "
            f"(`bench/scale_corpus.py`: {', '.join(k for k, v in sources.items() if k not in ('paragraphs', 'characters') and v)}); "
            f"size n = its first n paragraphs. Queries: {N_QUERIES:,} held-out paragraphs' first 12 words. "
            f"RSS exponent: of the peak above a bare interpreter ({BASE_MIB:.0f} MiB).\n\n"
            + table(header, rows) + "\n\n![scale](scale.png)\n")
    if not args.no_peers:
        prow = peers(allrecs[:max(ns)], qtexts, ltexts, work, args.datasketch_docs, results[max(ns)]["dedup"],
                     args.rounds)
        body += (f"\nAt {max(ns):,} documents, each system in its own process (ratio > 1: cptkit is better):\n\n"
                 + table(["measure", "cptkit", "peer", "peer name", "ratio"], prow) + "\n")
    print(body)
    if not args.no_report:
        write_section("scale", "Scale: dedup, retrieve, build-mix from 10k to 1M documents",
                      "python bench/scale.py", body)


if __name__ == "__main__":
    main()
