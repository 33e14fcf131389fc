"""``executor=ray``: a step's shard tasks as Ray tasks on a real local Ray cluster (``ray start``).

The outputs must be byte-identical to a local run: score-quality (one wave of slices) and dedup,
both with in-memory clustering and with the map/reduce backend (map, reduce, final waves).
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cptkit.core.net import free_port
from tests.conftest import write_jsonl

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
# The cluster and its clients share a HOME of their own: a ~/.ray/auth_token left by an earlier
# ray.init() would make `ray start` demand a token that a client started with another HOME lacks.
RAY_HOME = Path(tempfile.mkdtemp(prefix="cptkit-ray-home-"))
atexit.register(shutil.rmtree, RAY_HOME, True)  # every process that imports this module made one
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "HOME": str(RAY_HOME)}


def stop_cluster(pgid: int) -> None:
    """Stop one cluster: the process group its ``ray start`` ran in (a session of its own), and no
    other. ``ray stop --force`` kills every Ray process on the machine, including the cluster another
    pytest-xdist worker runs for its share of these tests (its GCS died mid-test and the client hung);
    and the agents and client server outlive a killed raylet (the server holding port 10001)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(1)


@pytest.fixture(scope="module", autouse=True)
def ray_home():
    yield RAY_HOME
    shutil.rmtree(RAY_HOME, ignore_errors=True)


def start_cluster(tmp: Path) -> tuple[str, int]:
    """``ray start --head`` with 2 CPUs in a session of its own: (its address, its process group)."""
    for _ in (1, 2):  # a port taken between free_port() and `ray start` fails the start: one more try
        port = free_port()
        p = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                              f"--ray-client-server-port={free_port()}", "--num-cpus=2", "--include-dashboard=false",
                              f"--temp-dir={tmp}",
                              "--disable-usage-stats"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=os.environ | RAY_ENV, start_new_session=True)
        out, _ = p.communicate()
        if p.returncode == 0:
            return f"127.0.0.1:{port}", p.pid
        stop_cluster(p.pid)
    raise AssertionError(f"ray start failed twice; the last time:\n{out[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node Ray cluster with 2 CPUs, started and stopped by the test."""
    tmp = tmp_path_factory.mktemp("ray")
    address, pgid = start_cluster(tmp)
    try:
        yield address
    finally:
        stop_cluster(pgid)
        shutil.rmtree(tmp, ignore_errors=True)


def cptkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cptkit"), *args, "--quiet"], capture_output=True, text=True,
                          env=os.environ | RAY_ENV)


def tree(out: Path) -> dict[str, bytes]:
    """Data shards and side outputs (not the manifest, which records timings)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != "_manifest.json"}


@pytest.fixture(scope="module")
def shards(corpus_dir: Path, tmp_path_factory) -> Path:
    """Six input shards (so that slices really split the work), with some exact duplicates."""
    from tests.conftest import read_jsonl_dir

    recs = read_jsonl_dir(corpus_dir)[:600]
    recs += [dict(r, id=r["id"] + "-copy") for r in recs[:60]]
    d = tmp_path_factory.mktemp("shards")
    for i in range(6):
        write_jsonl(d / f"part-{i}.jsonl", recs[i::6])
    return d


@pytest.mark.parametrize("cluster_kind", ["memory", "mapreduce"])
def test_dedup_on_ray_equals_local(cluster: str, shards: Path, tmp_path: Path, cluster_kind: str):
    opts = [f"dedup.cluster={cluster_kind}", "shard.task_bytes=0"]  # a task per shard: slices split the work
    local = cptkit("dedup", "--in", str(shards), "--out", str(tmp_path / "local"), *opts)
    assert local.returncode == 0, local.stderr
    on_ray = cptkit("dedup", "--in", str(shards), "--out", str(tmp_path / "ray"), *opts,
                    "executor=ray", f"executor.address={cluster}", "executor.workers=3")
    assert on_ray.returncode == 0, on_ray.stderr
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert (tmp_path / "ray" / "_removed.jsonl").read_text().count("\n") >= 60


def test_score_quality_on_ray_equals_local(cluster: str, shards: Path, corpus_dir: Path, tmp_path: Path):
    model = tmp_path / "quality"
    pos, neg = str(corpus_dir / "part-00000-*"), str(corpus_dir / "part-00002-*")
    trained = cptkit("score-quality-train", "--positives", pos, "--negatives", neg, "--out", str(model))
    assert trained.returncode == 0, trained.stderr
    args = ["score-quality", "--in", str(shards), f"quality.model={model}", "shard.task_bytes=0"]  # a task per shard
    assert cptkit(*args, "--out", str(tmp_path / "local")).returncode == 0
    on_ray = cptkit(*args, "--out", str(tmp_path / "ray"), "executor=ray", f"executor.address={cluster}",
                    "executor.workers=4")
    assert on_ray.returncode == 0, on_ray.stderr
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert len([n for n in tree(tmp_path / "ray") if n.startswith("part-")]) == 6


def test_executor_errors_are_one_line(tmp_path: Path, shards: Path):
    res = cptkit("dedup", "--in", str(shards), "--out", str(tmp_path / "o"), "executor=spark")
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "executor='spark'" in res.stderr
    res = cptkit("dedup", "--in", str(shards), "--out", str(tmp_path / "o"), "executor=ray", "executor.workers=0")
    assert res.returncode == 2 and "executor.workers" in res.stderr
    assert not (tmp_path / "o").exists()


def test_a_dead_cluster_fails_the_run_in_one_line(tmp_path: Path, shards: Path):
    """No cluster at the address: one line naming it. A cluster that dies mid-run: the run fails within
    seconds naming its address, instead of ray.get() waiting forever (13 min, until the suite's hang)."""
    nobody = f"127.0.0.1:{free_port()}"
    res = cptkit("dedup", "--in", str(shards), "--out", str(tmp_path / "o"), "executor=ray",
                 f"executor.address={nobody}")
    assert res.returncode != 0 and res.stderr.strip().count("\n") == 0, res.stderr
    assert nobody in res.stderr and not (tmp_path / "o").exists()

    # Enough text that the map/reduce waves take seconds: the cluster is killed the moment the first is
    # submitted, long before the last could finish.
    rng, words = random.Random(0), [f"w{i}" for i in range(5000)]
    big = tmp_path / "big"
    for i in range(6):
        write_jsonl(big / f"part-{i}.jsonl", [{"id": f"{i}-{j}", "text": " ".join(rng.choices(words, k=80))}
                                              for j in range(3000)])
    tmp = Path(tempfile.mkdtemp(prefix="cptkit-ray-"))  # short: Ray's socket paths must fit 107 bytes
    address, pgid = start_cluster(tmp)
    try:
        run = subprocess.Popen([str(BIN / "cptkit"), "dedup", "--in", str(big), "--out", str(tmp_path / "o"),
                                "dedup.cluster=mapreduce", "executor=ray", f"executor.address={address}",
                                "executor.workers=2"],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=os.environ | RAY_ENV)
        for line in run.stderr:  # the first wave has been submitted: the cluster goes away under it
            if "wave 1/" in line:
                break
        stop_cluster(pgid)
        rc = run.wait(timeout=120)  # not a timing: a run that hangs (the bug) fails here instead of for ever
        err = run.stderr.read()
    finally:
        stop_cluster(pgid)
        shutil.rmtree(tmp, ignore_errors=True)
    # Ray itself prints its raylet's last log lines; the run's own error is the last line and names the
    # cluster (the watch's "stopped answering", or Ray's NodeDiedError when it noticed first).
    assert rc == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ray") and address in last, err
    assert not (tmp_path / "o" / "_SUCCESS").exists()


def test_dedup_on_ray_with_no_shared_directory_writes_to_s3(shards: Path, tmp_path: Path, monkeypatch):
    """The output is a bucket on a real S3 server (moto's, tests/s3_server.py), not a shared directory:
    each member writes into a staging directory of its own process and the store holds the run state
    between the map, reduce and final waves. The objects equal a local run's files byte for byte."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    sys.path.insert(0, str(Path(__file__).parent))
    import s3_server
    import s3fs

    srv = s3_server.start()
    tmp = Path(tempfile.mkdtemp(prefix="cptkit-ray-"))
    try:
        for k, v in srv.env().items():  # every node reads its credentials from its own environment
            monkeypatch.setenv(k, v)
        staging = tmp_path / "staging"
        monkeypatch.setenv("CPTKIT_STAGING", str(staging))
        srv.make_bucket("bkt")
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        for p in sorted(shards.iterdir()):
            fs.put_file(str(p), f"bkt/in/{p.name}")
        address, pgid = start_cluster(tmp)
        try:
            opts = ["dedup.cluster=mapreduce", "shard.task_bytes=0"]
            on_ray = cptkit("dedup", "--in", "s3://bkt/in/", "--out", "s3://bkt/out/", *opts, "executor=ray",
                            f"executor.address={address}", "executor.workers=3")
        finally:
            stop_cluster(pgid)
        assert on_ray.returncode == 0, on_ray.stderr
        local = cptkit("dedup", "--in", str(shards), "--out", str(tmp_path / "local"), *opts)
        assert local.returncode == 0, local.stderr
        got = {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.find("bkt/out", maxdepth=1)
               if not p.endswith("_manifest.json")}
        assert got == tree(tmp_path / "local") and "_SUCCESS" in got
        assert len([n for n in got if n.startswith("part-")]) == 6
        assert not any(staging.iterdir())  # every member's staging directory is gone: the store holds it all
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
