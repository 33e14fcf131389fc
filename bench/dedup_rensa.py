"""cptkit dedup vs rensa at 1M documents, end to end, side by side in one run.

Corpus: the first ``--docs`` paragraphs of ``bench/scale_corpus.py``'s corpus (as ``bench/scale.py``:
gzipped JSONL shards of 50,000 records).

* **cptkit**: the command a user types, ``cptkit dedup --in SUB --out OUT --quiet [dedup.workers=N]``,
  a fresh process under ``/usr/bin/time``: interpreter and numba start-up, reading and writing the
  gzip shards, exact-duplicate hashing, shingling, MinHash, LSH, exact verification, ``_removed.jsonl``.
  Once per ``--workers`` value (1: one process; 2: the per-shard phases in two forked processes).
* **rensa, end to end** (Rust, single-threaded): :data:`RENSA_E2E`, the script a rensa user writes to
  get the same files - a fresh process under ``/usr/bin/time`` reading the same gzip shards
  (``gzip`` + ``json``), ``RMinHash.update(shingles)`` + ``RMinHashLSH(0.8, 128, num_bands=16)``,
  query then insert, each kept line copied as read into a gzip shard (level 6, as cptkit's writer),
  the removed ids with their LSH hits into ``_removed.jsonl``. Same shingles as cptkit's (``words``
  tokens, lower-cased, 13-grams joined as strings, made in Python per document). No exact
  verification: that is rensa's design, and it shows in the precision column.
* **rensa, in memory**: ``bench/dedup.py``'s ``run_rensa``, the same loop in a forked child on the
  texts already in memory: no start-up, no reading, no writing (the lower bound of the row above).

Precision: share of a method's removed documents whose exact 13-gram Jaccard to the document it was
removed for (cptkit: ``duplicate_of``, or else another member of its cluster, as a document joins
through a chain of verified pairs; rensa: the best of its LSH hits) is >= 0.8. Recall at 1M has
no all-pairs truth; the "recall vs pooled pairs" column is the share of the pooled true pairs
(every removed-for pair of either method with exact J >= 0.8) of which the method removes at least
one document. With ``--check`` the removed ids of every cptkit run are compared (they must be equal).

    python bench/dedup_rensa.py [--docs 1000000] [--workers 1,2] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import dedup as bd  # noqa: E402
from bench import scale as bs  # noqa: E402
from bench._report import table, write_section  # noqa: E402
from cptkit.dedup import minhash as mh  # noqa: E402


def run_timed(cmd: list[str], out: Path, env: dict | None = None) -> dict:
    """``cmd`` (which writes ``out``) in a fresh process under ``/usr/bin/time``: wall and CPU seconds,
    peak RSS, the removed records of ``out/_removed.jsonl``, the load average before and after."""
    shutil.rmtree(out, ignore_errors=True)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)[:300]}\n{p.stderr[-3000:]}")
    rss_kb, user, system = p.stderr.strip().splitlines()[-1].split()
    removed = [json.loads(line) for line in (out / "_removed.jsonl").read_text().splitlines()]
    return {"s": wall, "cpu": float(user) + float(system), "rss": int(rss_kb) / 1024, "removed": removed,
            "load": (load0, os.getloadavg()[0])}


def run_cptkit(sub: Path, out: Path, workers: int) -> dict:
    return run_timed(bs.cptkit_cmd() + ["dedup", "--in", str(sub), "--out", str(out), "--quiet",
                                        f"dedup.workers={workers}"], out)


RENSA_E2E = """\
import gzip, json, sys
from pathlib import Path
from rensa import RMinHash, RMinHashLSH
from cptkit.text.tokenize import word_tokenizer

words = word_tokenizer("minhash").findall  # the 13-gram shingles of cptkit dedup's `words` tokens
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True)
lsh, ids = RMinHashLSH(threshold=0.8, num_perm=128, num_bands=16), []
with open(dst / "_removed.jsonl", "w", encoding="utf-8") as removed:
    for shard in sorted(src.glob("*.jsonl.gz")):
        with gzip.open(shard, "rt", encoding="utf-8") as f, \\
                gzip.open(dst / shard.name, "wt", encoding="utf-8", compresslevel=6) as out:
            for line in f:
                rec = json.loads(line)
                toks = words(rec["text"].lower())
                m = RMinHash(num_perm=128, seed=42)
                m.update([" ".join(toks[i:i + 13]) for i in range(max(len(toks) - 12, 1))])
                ids.append(rec["id"])
                hits = lsh.query(m)
                if hits:
                    removed.write(json.dumps({"id": rec["id"], "hits": [ids[h] for h in sorted(hits)]}) + "\\n")
                else:
                    lsh.insert(len(ids) - 1, m)
                    out.write(line)
"""


def run_rensa_e2e(sub: Path, out: Path) -> dict:
    """:data:`RENSA_E2E` in a fresh process, timed as the cptkit command is."""
    return run_timed([sys.executable, "-c", RENSA_E2E, str(sub), str(out)], out,
                     env={**os.environ, "PYTHONPATH": str(ROOT)})


def run_rensa(docs: list[dict]) -> dict:
    load0 = os.getloadavg()[0]
    removed, s, cpu, peak = bd.measure(bd.run_rensa, docs)
    return {"s": s, "cpu": cpu, "rss": peak / 2**20, "removed": removed, "load": (load0, os.getloadavg()[0])}


def quality(docs: list[dict], results: dict[str, dict[int, list[int]]]) -> tuple[dict[str, tuple[float, float]], int]:
    """(precision, recall vs pooled pairs) per method, and the number of pooled pairs (module docstring)."""
    cache: dict[int, set] = {}

    def grams(i: int) -> set:
        if i not in cache:
            cache[i] = bd.ngram_set(docs[i]["text"])
        return cache[i]

    jac: dict[tuple[int, int], float] = {}
    for removed in results.values():
        for i, ws in removed.items():
            for w in ws:
                p = (min(i, w), max(i, w))
                if p not in jac:
                    jac[p] = mh.jaccard_sets(grams(p[0]), grams(p[1]))
    pooled = [p for p, j in jac.items() if j >= bd.THRESHOLD]
    out = {}
    for name, removed in results.items():
        ok = {i for i, ws in removed.items() if max(jac[(min(i, w), max(i, w))] for w in ws) >= bd.THRESHOLD}
        if name.startswith("cptkit"):  # joined through a chain: a partner >= 0.8 elsewhere in its cluster
            members: dict[int, list[int]] = {}
            for i, ws in removed.items():
                members.setdefault(ws[0], [ws[0]]).append(i)
            for i in [i for i in removed if i not in ok]:
                if any(mh.jaccard_sets(grams(i), grams(m)) >= bd.THRESHOLD for m in members[removed[i][0]] if m != i):
                    ok.add(i)
        good = len(ok)
        recall = sum(a in removed or b in removed for a, b in pooled) / max(len(pooled), 1)
        out[name] = (good / max(len(removed), 1), recall)
    return out, len(pooled)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--workers", default="1,2", help="dedup.workers values to run, comma-separated")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cptkit-bench-dedup-rensa"))
    ap.add_argument("--corpus", type=Path, default=bs.CORPUS)
    ap.add_argument("--no-write", action="store_true", help="print only, do not update docs/benchmarks.md")
    args = ap.parse_args()
    bs.CORPUS = args.corpus
    docs = [{"id": r["id"], "text": r["text"]} for r in bs.read_corpus(args.docs)[:args.docs]]
    if len(docs) < args.docs:
        raise SystemExit(f"{args.corpus} holds {len(docs):,} paragraphs, fewer than {args.docs:,}")
    work = args.work
    sub = work / f"docs{args.docs}"
    bs.write_subset(docs, sub)
    warm = work / "warm-in"  # fill numba's on-disk cache, so that no timed run compiles
    bs.write_subset(docs[:2000], warm)
    run_cptkit(warm, work / "warm-out", 1)
    index = {d["id"]: i for i, d in enumerate(docs)}
    runs: dict[str, dict] = {}
    for w in [int(x) for x in args.workers.split(",")]:
        name = f"cptkit dedup, {w} process{'es' if w > 1 else ''} (dedup.workers={w})"
        print(f"running {name} ...", file=sys.stderr, flush=True)
        runs[name] = run_cptkit(sub, work / f"out-w{w}", w)
    e2e = "rensa 0.5.0 end to end (the script below: gzip JSONL in and out)"
    print("running rensa end to end ...", file=sys.stderr, flush=True)
    runs[e2e] = run_rensa_e2e(sub, work / "out-rensa")
    print("running rensa in memory ...", file=sys.stderr, flush=True)
    runs["rensa 0.5.0 in memory (its loop on the texts: no start-up, no I/O)"] = run_rensa(docs)
    results: dict[str, dict[int, list[int]]] = {}
    for name, r in runs.items():
        if name.startswith("cptkit"):
            results[name] = {index[x["id"]]: [index[x["duplicate_of"]]] for x in r["removed"]}
        elif name == e2e:
            results[name] = {index[x["id"]]: [index[h] for h in x["hits"]] for x in r["removed"]}
        else:
            results[name] = r["removed"]
    rensa_same = results[e2e] == next(v for n, v in results.items() if n.startswith("rensa") and n != e2e)
    cptkit_sets = {name: sorted(results[name]) for name in results if name.startswith("cptkit")}
    same = len({json.dumps(v) for v in cptkit_sets.values()}) == 1
    q, n_pooled = quality(docs, results)
    ref = runs[e2e]
    rows = [[name, f"{r['s']:.1f}", f"{r['cpu']:.1f}", f"{ref['s'] / r['s']:.2f}x", f"{ref['cpu'] / r['cpu']:.2f}x",
             f"{r['rss']:,.0f}", f"{len(results[name]):,}", f"{q[name][0]:.4f}", f"{q[name][1]:.4f}",
             f"{r['load'][0]:.1f} / {r['load'][1]:.1f}"]
            for name, r in runs.items()]
    header = ["method", "wall s", "CPU s", "rensa e2e wall / this", "rensa e2e CPU / this", "peak RSS MiB",
              "removed", "precision", "recall vs pooled pairs", "load avg (1 min) start / end"]
    n_chars = sum(len(d["text"]) for d in docs)
    body = (f"{len(docs):,} paragraphs ({n_chars / 1e6:,.0f} M characters), the first of `bench/scale_corpus.py`'s "
            f"corpus, in {len(list(sub.glob('*.jsonl.gz')))} gzipped shards; threshold 0.8, 128 permutations, "
            "13-gram word shingles for both. cptkit: the `cptkit dedup` command end to end (a fresh process: "
            "start-up, gzip JSONL in and out, exact hashing, shingling, MinHash, 18 x 7 LSH, exact "
            "verification); rensa end to end: the script below, a fresh process doing the same file work around "
            "rensa's MinHash + LSH (no verification), single-threaded; rensa in memory: the same loop on texts "
            "already in memory (no start-up, no I/O). Ratio > 1: cptkit is faster than rensa end to end. "
            "CPU s: user + system of the process (cptkit's gzip writer thread and, with 2 processes, both "
            "workers included).\n\n"
            + table(header, rows)
            + f"\n\ncptkit removed the same ids with every `dedup.workers`: {'yes' if same else 'NO'}. Precision: share "
            "of removed documents whose exact 13-gram Jaccard to the document they were removed for is >= 0.8 "
            "(cptkit: `duplicate_of`, or another member of its cluster for a document joined through a chain; rensa: its best LSH hit). Recall vs pooled pairs: "
            f"share of the {n_pooled:,} pooled true pairs (every removed-for pair of either method with exact "
            "J >= 0.8) of which the method removes at least one document; there is no all-pairs truth at this size. "
            f"rensa end to end removed the same documents as rensa in memory: {'yes' if rensa_same else 'NO'}.\n\n"
            "rensa end to end (`RENSA_E2E` in bench/dedup_rensa.py, run as `python -c SCRIPT IN OUT`):\n\n"
            f"```python\n{RENSA_E2E}```\n")
    print(body)
    if not args.no_write:
        cmd = "python bench/dedup_rensa.py" + (f" --docs {args.docs}" if args.docs != 1_000_000 else "")
        write_section("dedup-rensa", f"dedup at {len(docs):,} documents: cptkit vs rensa, end to end", cmd, body)


if __name__ == "__main__":
    main()
