"""The cost of an object store: the same dedup and build-mix runs on the local disk and on a local S3
server (moto's, tests/s3_server.py, on loopback), as a ratio of wall-clock seconds.

The corpus is real text: Debian's HTML documentation (/usr/share/doc) as JSONL shards, each page a few
times with a word changed (near duplicates for dedup). Each run is the CLI in a fresh process, the
two sides interleaved, best of ``--repeat``; the store's outputs are checked equal to the local ones
byte for byte. Uploading the corpus is not timed.

    python bench/s3_overhead.py --pages 200 --repeat 3   # about 4 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench._report import table, write_section  # noqa: E402


def corpus(d: Path, pages: int, shards: int = 8) -> int:
    from resiliparse.extract.html2text import extract_plain_text

    paths = sorted(f for f in glob.glob("/usr/share/doc/**/*.html", recursive=True)
                   if os.path.isfile(f) and os.path.getsize(f) > 2048)[:pages]
    recs = []
    for i, p in enumerate(paths):
        text = extract_plain_text(Path(p).read_bytes().decode("utf-8", "replace"), main_content=False)
        if not text.strip():
            continue
        recs.append({"id": f"doc{i}", "text": text, "source": p.split("/")[4]})
        words = text.split()
        if len(words) > 50:  # a near copy: one word in 50 changed
            recs.append({"id": f"doc{i}-near", "text": " ".join(w if k % 50 else "changed" for k, w in enumerate(words)),
                         "source": p.split("/")[4]})
    d.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        (d / f"part-{s}.jsonl.gz").write_bytes(gzip.compress(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs[s::shards]).encode(), mtime=0))
    return len(recs)


def cli(*args: str, env: dict) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cptkit.cli", *args, "--quiet"], check=True, env=env)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    import s3_server
    import s3fs

    from cptkit.models.tiny import train_bpe_tokenizer

    srv = s3_server.start()
    env = {**os.environ, **srv.env(), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        with tempfile.TemporaryDirectory(prefix="cptkit-bench-s3-") as tmp:
            t = Path(tmp)
            n = corpus(t / "corpus", a.pages)
            texts = [json.loads(line)["text"] for f in sorted((t / "corpus").iterdir())
                     for line in gzip.open(f, "rt")]
            train_bpe_tokenizer(texts, vocab_size=2048, out_dir=t / "tok")
            srv.make_bucket("bench")
            os.environ.update(srv.env())
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            for f in sorted((t / "corpus").iterdir()):
                fs.put_file(str(f), f"bench/corpus/{f.name}")
            mix = ["mix.domains=[{name:docs}]", "mix.stages=[{name:main,weights:{docs:1}}]", "mix.fill=null",
                   "mix.budget_tokens=200000", "mix.seq_len=256", f"tokenizer={t / 'tok'}"]
            times: dict[tuple[str, str], list[float]] = {}
            for r in range(a.repeat):
                for side in ("local", "s3"):
                    base = str(t / f"{side}{r}") if side == "local" else f"s3://bench/{side}{r}"
                    src = str(t / "corpus") if side == "local" else "s3://bench/corpus/"
                    times.setdefault(("dedup", side), []).append(
                        cli("dedup", "--in", src, "--out", f"{base}/dedup", env=env))
                    times.setdefault(("build-mix", side), []).append(
                        cli("build-mix", "--in", f"{base}/dedup", "--out", f"{base}/mix", *mix, env=env))
            for step, sub in (("dedup", "dedup"), ("build-mix", "mix")):  # the store holds the local bytes
                local = t / "local0" / sub
                for p in sorted(local.rglob("*")):
                    rel = p.relative_to(local).as_posix()
                    if p.is_file() and ".cptkit" not in rel and rel not in ("_manifest.json", "stream.json"):
                        assert fs.cat_file(f"bench/s30/{sub}/{rel}") == p.read_bytes(), (step, rel)
            size = sum(f.stat().st_size for f in (t / "corpus").iterdir())
    finally:
        srv.stop()
    rows = []
    for step in ("dedup", "build-mix"):
        lo, s3 = min(times[(step, "local")]), min(times[(step, "s3")])
        rows.append([step, lo, " ".join(f"{x:.1f}" for x in times[(step, "local")]), s3,
                     " ".join(f"{x:.1f}" for x in times[(step, "s3")]), s3 / lo])
    spread = max(max(v) - min(v) for v in times.values())
    body = (f"{n:,} documents ({size / 2**20:.1f} MiB of JSONL.gz in 8 shards) of Debian's HTML documentation "
            "with near copies; build-mix reads dedup's output and packs 200,000 tokens (a 2,048-token BPE). "
            f"Each run is the CLI in a new process; best of {a.repeat}, the sides interleaved. The S3 server is "
            "moto's on loopback (tests/s3_server.py): no network latency, but every request goes through HTTP, "
            "signing and moto's Python server.\n\n"
            + table(["step", "local disk s (best)", "every run", "local S3 server s (best)", "every run",
                     "× local"], rows)
            + "\n\nThe store's objects were checked equal to the local files byte for byte (data shards, "
              "side outputs, tokens, plan). The overhead is the store's round trips: the listing and "
              "fingerprints (size and ETag) of the inputs, the pull of the run state on open, one upload "
              "per file (each shard, each marker) and the conditional put of the lock: "
            + "; ".join(f"{r[0]} {r[3] - r[1]:+.1f} s" for r in rows)
            + f" (one side's runs spread up to {spread:.1f} s on this machine, 2 cores shared with other "
              "jobs). A local run also reads every input once to hash it (sha256, then cached), where a store "
              "input's fingerprint is its ETag.")
    print(body)
    if not a.no_write:
        write_section("s3", "s3: the cost of an object store (dedup, build-mix)",
                      f"python bench/s3_overhead.py --pages {a.pages} --repeat {a.repeat}", body)


if __name__ == "__main__":
    main()
