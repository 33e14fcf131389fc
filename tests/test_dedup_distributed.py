"""Distributed dedup: bucket map/reduce over files and LSH buckets in a real redis-server give
byte-for-byte the output of the single-process run; phases resume per shard and per partition."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_jsonl

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.core.net import free_port
from cptkit.dedup import minhash as mh
from cptkit.steps.dedup import run

NSHARDS = 4
COMPARED = ("docs in", "docs out", "exact duplicates", "near duplicates", "duplicate clusters",
            "candidate pairs", "verified pairs")


def edit(text: str, frac: float, rng: random.Random) -> str:
    words = text.split()
    k = max(1, int(len(words) * frac))
    s = rng.randrange(0, len(words) - k)
    words[s:s + k] = [f"zz{rng.randrange(10**6)}" for _ in range(k)]
    return " ".join(words)


@pytest.fixture(scope="module")
def corpus(corpus_records, tmp_path_factory) -> Path:
    """The corpus slice in 4 shards plus planted copies: near (1-3% edited), exact (case and
    spacing changed), and a family of 24 near copies of one document with an exact copy among
    them (buckets beyond bucket_all_pairs_max that hold an exact duplicate)."""
    rng = random.Random(1)
    shards: list[list[dict]] = [[] for _ in range(NSHARDS)]
    for i, r in enumerate(corpus_records):
        shards[i * NSHARDS // len(corpus_records)].append({k: r[k] for k in ("id", "text", "lang")})
    en = [r for s in shards[:2] for r in s if r["lang"] == "en" and len(r["text"].split()) >= 200]
    rng.shuffle(en)
    copies = [(r["id"] + "~near", edit(r["text"], rng.choice([0.01, 0.02, 0.03]), rng)) for r in en[:25]]
    copies += [(r["id"] + "~exact", "  " + r["text"].upper().replace(" ", "\n ")) for r in en[25:35]]
    fam = en[35]
    copies += [(f"{fam['id']}~fam{k}", edit(fam["text"], 0.01, rng)) for k in range(24)]
    copies.insert(len(copies) - 12, (fam["id"] + "~famexact", fam["text"].replace(" ", "  ")))
    for k, (cid, text) in enumerate(copies):
        shards[2 + k % 2].append({"id": cid, "text": text, "lang": "x"})
    root = tmp_path_factory.mktemp("dd-dist") / "in"
    for k, recs in enumerate(shards):
        write_jsonl(root / f"shard{k}.jsonl.gz", recs)
    return root


PER_FILE = "shard.task_bytes=0"  # a task per shard (small shards share one by default): members split the work


def args(inp: Path, out: Path, *overrides: str) -> list[str]:
    return [f"io.inputs=['{inp}']", f"io.output='{out}'", "quiet=true", PER_FILE, *overrides]


def dedup(inp: Path, out: Path, *overrides: str) -> dict:
    return run(compose_step("dedup", args(inp, out, *overrides)))


def cli(inp: Path, out: Path, *overrides: str) -> subprocess.Popen:
    """`cptkit dedup` in its own process (as one member of a job array)."""
    cmd = [sys.executable, "-c", "from cptkit.cli import main; main()", "dedup", "--in", str(inp),
           "--out", str(out), "--quiet", PER_FILE, *overrides]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def array(inp: Path, out: Path, *overrides: str, count: int = 2) -> None:
    """Run ``count`` members of a job array (``shard.index=i``) at the same instant; all must succeed
    (each holds its own slice's lock; run state is written atomically)."""
    procs = []
    for i in range(count):
        procs.append(cli(inp, out, *overrides, f"shard.count={count}", f"shard.index={i}"))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name.startswith(("part-", "_removed"))}


def manifest_counts(out: Path) -> dict:
    extra = json.loads((out / "_manifest.json").read_text())["extra"]
    return {k: extra[k] for k in COMPARED}


def assert_same(out: Path, ref: Path) -> None:
    got, want = outputs(out), outputs(ref)
    assert list(got) == list(want)
    for name in want:
        assert got[name] == want[name], name
    assert manifest_counts(out) == manifest_counts(ref)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dd-ref") / "out"
    dedup(corpus, out)
    return out


def test_reference_has_the_hard_cases(reference):
    removed = {r["id"]: r for r in map(json.loads, (reference / "_removed.jsonl").read_text().splitlines())}
    kinds = [r["kind"] for r in removed.values()]
    assert kinds.count("exact") >= 11 and kinds.count("near") >= 40
    fam = [r for i, r in removed.items() if "~fam" in i]
    assert len(fam) == 25  # the whole family joins its original
    assert len({r["duplicate_of"] for r in fam}) == 1
    assert next(r for i, r in removed.items() if i.endswith("~famexact"))["kind"] == "exact"


def test_merge_candidates_equals_candidate_pairs():
    """Partitioned buckets + exact-duplicate filtering = LSH over the kept documents (pure functions)."""
    rng = np.random.default_rng(0)
    for trial in range(20):
        n, b, parts = 2000, 4, 1 + trial % 7
        keys = rng.integers(0, 30 + 20 * trial, size=(n, b)).astype(np.uint64)  # many big buckets
        keep = rng.random(n) > 0.25
        want = mh.candidate_pairs(keys[keep], np.flatnonzero(keep), 4)
        band = np.tile(np.arange(b, dtype=np.uint16), n)
        doc = np.repeat(np.arange(n), b)
        part = mh.partition_of(keys.ravel(), parts)
        outs = [mh.bucket_candidates(band[part == p], keys.ravel()[part == p], doc[part == p], 4) for p in range(parts)]
        got = mh.merge_candidates(*zip(*outs, strict=True), keep, 4)
        assert np.array_equal(got, want), trial
        assert len(got) > 1000
    hashes = rng.integers(0, 6, size=(300, 2)).astype(np.uint64)
    first = np.arange(300)
    dup = mh.exact_groups(hashes, np.arange(300))
    first[dup[:, 0]] = dup[:, 1]
    assert np.array_equal(first, mh.first_occurrence(hashes))


def test_mapreduce_job_array_equals_single_process(corpus, reference, tmp_path):
    out = tmp_path / "mr"
    mr = ("dedup.cluster=mapreduce", "dedup.partitions=5")
    array(corpus, out, *mr, "dedup.phase=map")
    state = out / ".cptkit"
    assert sorted(p.name for p in (state / "map").iterdir()) == [f"{t:05d}.json" for t in range(NSHARDS)]
    assert len(list((state / "buckets").glob("p-*/m-*.npz"))) == 5 * NSHARDS
    with pytest.raises(CptkitError, match=r"dedup\.phase=final: the reduce of 5 items is unfinished"):
        dedup(corpus, out, *mr, "dedup.phase=final")
    array(corpus, out, *mr, "dedup.phase=reduce")
    assert len(list((state / "reduce").iterdir())) == 5
    array(corpus, out, *mr, "dedup.phase=final")
    assert_same(out, reference)
    assert not (state / "buckets").exists()  # cleaned up once complete


def test_partition_and_shard_resume(corpus, reference, tmp_path):
    out = tmp_path / "resume"
    mr = ("dedup.cluster=mapreduce", "dedup.partitions=4")
    dedup(corpus, out, *mr, "dedup.phase=map")
    dedup(corpus, out, *mr, "dedup.phase=reduce")
    state = out / ".cptkit"

    def stamps(pattern: str) -> dict[str, int]:
        return {str(p.relative_to(state)): p.stat().st_mtime_ns for p in state.glob(pattern)}

    pairs, buckets = stamps("pairs/*.npz"), stamps("buckets/*/*.npz")
    time.sleep(0.02)
    (state / "reduce" / "p-0002.json").unlink()  # a requeued array: one partition unfinished
    (state / "map" / "00001.json").unlink()  # ... and one shard
    dedup(corpus, out, *mr, "dedup.phase=map")
    redone = {k for k, v in stamps("buckets/*/*.npz").items() if v != buckets[k]}
    assert redone == {f"buckets/p-{p:04d}/m-00001.npz" for p in range(4)}
    dedup(corpus, out, *mr, "dedup.phase=reduce")
    assert {k for k, v in stamps("pairs/*.npz").items() if v != pairs[k]} == {"pairs/p-0002.npz"}
    dedup(corpus, out, *mr, "dedup.phase=final")
    assert_same(out, reference)


@pytest.mark.parametrize("overrides", [("dedup.verify=estimate",),
                                       ("dedup.lowercase=false", "dedup.bucket_all_pairs_max=3")])
def test_mapreduce_equals_memory_other_settings(corpus, tmp_path, overrides):
    dedup(corpus, tmp_path / "mem", *overrides)
    dedup(corpus, tmp_path / "mr", *overrides, "dedup.cluster=mapreduce", "dedup.partitions=3")
    assert_same(tmp_path / "mr", tmp_path / "mem")


# -- Redis ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    binary = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if binary is None:
        pytest.skip("redis-server is not installed: make install does it as root (apt-get install redis-server)")
    import redis

    port, tmp = free_port(), tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp), "--daemonize", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def test_redis_equals_single_process(corpus, reference, redis_url, tmp_path):
    import redis

    r = redis.Redis.from_url(redis_url)
    out, other = tmp_path / "rd", tmp_path / "rd2"
    rd = ("dedup.cluster=redis", f"dedup.redis_url={redis_url}", "dedup.partitions=4")
    array(corpus, out, *rd, "dedup.phase=map")
    keys = r.keys("cptkit:dedup:*")
    ns = {k.split(b":")[2] for k in keys}
    assert len(ns) == 1 and len(keys) > 1000
    assert r.scard(b"cptkit:dedup:" + ns.pop() + b":maps") == NSHARDS
    # a concurrent run of the same config into another output uses its own namespace
    dedup(corpus, other, *rd)
    assert set(r.keys("cptkit:dedup:*")) == set(keys)  # ... and removes only that one
    assert_same(other, reference)
    array(corpus, out, *rd, "dedup.phase=reduce")
    dedup(corpus, out, *rd, "dedup.phase=final")
    assert_same(out, reference)
    assert r.keys("cptkit:dedup:*") == []  # namespace removed once complete
    assert json.loads((out / "_manifest.json").read_text())["config"]["dedup"]["redis_url"] == redis_url


def test_redis_unreachable_is_one_clear_error(corpus, tmp_path):
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    p = cli(corpus, tmp_path / "o", "dedup.cluster=redis", f"dedup.redis_url={url}")
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert f"dedup.redis_url=redis://:<redacted>@127.0.0.1:{url.rsplit(':', 1)[1]}: cannot reach Redis" in err
    assert "hunter2" not in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_member_keeps_the_lines_caches_until_the_whole_output_is_written(corpus, reference, tmp_path):
    """The final phase's lines caches (phase 1's serialised records, read by the clustering) stay until every
    member's shards are written: a member that finishes first must not delete the caches that another member,
    still clustering, is reading (that race failed a job array with FileNotFoundError)."""
    out = tmp_path / "lines"
    mr = ("dedup.cluster=mapreduce", "dedup.partitions=3")
    dedup(corpus, out, *mr, "dedup.phase=map")
    dedup(corpus, out, *mr, "dedup.phase=reduce")
    state = out / ".cptkit"
    caches = sorted(p.name for p in state.glob("lines-*.jsonl.zst"))
    assert len(caches) == NSHARDS
    dedup(corpus, out, *mr, "dedup.phase=final", "shard.count=2", "shard.index=0")
    assert sorted(p.name for p in state.glob("lines-*.jsonl.zst")) == caches  # member 1 has not written yet
    dedup(corpus, out, *mr, "dedup.phase=final", "shard.count=2", "shard.index=1")
    assert not list(state.glob("lines-*"))  # complete: dropped
    assert_same(out, reference)
