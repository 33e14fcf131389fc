"""Object stores as ``--in`` and ``--out``, against a real S3 server started here (moto's server mode
on loopback, IAM auth on: tests/s3_server.py). No mocked client: s3fs and boto speak HTTP to it.

Each guarantee of an output in an object store has its test (docs/records.md): whole shards and
``_SUCCESS`` last (the kill test), a second writer refused by a conditional put, resume keyed to ETags,
a killed run resumed to byte-identical output; reads stream; errors are one line.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import run_main, write_jsonl

pytest.importorskip("s3fs")
pytest.importorskip("moto")
import s3_server  # noqa: E402

from cptkit.core.errors import CptkitError  # noqa: E402
from cptkit.core.remote import RemoteOutput  # noqa: E402
from cptkit.core.shards import read_records, resolve_inputs  # noqa: E402

CLI = [sys.executable, "-m", "cptkit.cli"]
BUCKET = "bkt"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, its user's key in the environment (as boto reads it), a bucket; stopped at the end."""
    srv = s3_server.start()
    old = {k: os.environ.get(k) for k in (*srv.env(), "CPTKIT_STAGING")}
    os.environ.update(srv.env())
    os.environ["CPTKIT_STAGING"] = str(tmp_path_factory.mktemp("staging"))
    srv.make_bucket(BUCKET)
    try:
        yield srv
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fs():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def upload(local: Path, url: str) -> None:
    """Every file under ``local`` to the prefix ``url``."""
    f = fs()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            f.put_file(str(p), f"{url.removeprefix('s3://').rstrip('/')}/{p.relative_to(local).as_posix()}")


def objects(url: str, data_only: bool = True) -> dict[str, bytes]:
    """The objects under ``url`` by relative name (without run state and manifest: ``data_only``)."""
    f = fs()
    root = url.removeprefix("s3://").rstrip("/")
    out = {}
    for p in sorted(f.find(root)):
        rel = p[len(root) + 1:]
        if data_only and (rel.startswith(".cptkit/") or rel == "_manifest.json"):
            continue
        out[rel] = f.cat_file(p)
    return out


def files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and ".cptkit" not in p.parts and p.name != "_manifest.json"}


@pytest.fixture(scope="module")
def corpus(corpus_records, tmp_path_factory) -> Path:
    """Real text in 6 JSONL shards (some exact copies to remove) and a WET file of the same kind."""
    import io

    from warcio.warcwriter import WARCWriter

    d = tmp_path_factory.mktemp("corpus")
    recs = [{k: r[k] for k in ("id", "text", "lang", "source")} for r in corpus_records[::3]]  # every source
    recs += [dict(r, id=r["id"] + "-copy") for r in recs[:30]]
    for i in range(6):
        write_jsonl(d / f"part-{i}.jsonl.gz", recs[i::6])
    with open(d / "CC-MAIN-x.warc.wet.gz", "wb") as fh:
        w = WARCWriter(fh, gzip=True)
        for r in recs[:20]:
            w.write_record(w.create_warc_record(f"http://localhost/{r['id']}", "conversion",
                                                payload=io.BytesIO(r["text"].encode()),
                                                warc_headers_dict={"Content-Type": "text/plain"}))
    return d


@pytest.mark.slow(minutes=1)
def test_a_step_writes_to_the_store_and_another_reads_it_equal_to_local_runs(s3, corpus, corpus_records, tmp_path,
                                                                             capsys):
    """dedup from the store to the store, then build-mix from the store: every object equals the
    local run's file byte for byte."""
    from mixdata import make_tokenizer

    url = "s3://bkt/t1"
    upload(corpus, f"{url}/cc")
    assert run_main(["dedup", "--in", f"{url}/cc/", "--out", f"{url}/deduped/", "--quiet"]) == 0, capsys.readouterr()
    assert run_main(["dedup", "--in", corpus, "--out", tmp_path / "deduped", "--quiet"]) == 0
    local = files(tmp_path / "deduped")
    assert objects(f"{url}/deduped") == local and any(n.startswith("part-") for n in local)
    assert "_SUCCESS" in objects(f"{url}/deduped")

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    mix = ["mix=demo", "mix.budget_tokens=20000", "mix.seq_len=128", f"tokenizer={tok}", "--quiet"]
    assert run_main(["build-mix", "--in", f"{url}/deduped/", "--out", f"{url}/mix/", *mix]) == 0, capsys.readouterr()
    assert run_main(["build-mix", "--in", tmp_path / "deduped", "--out", tmp_path / "mix", *mix]) == 0
    local_mix = {k: v for k, v in files(tmp_path / "mix").items() if k.startswith(("tokens/", "plan"))}
    assert local_mix and {k: v for k, v in objects(f"{url}/mix").items() if k in local_mix} == local_mix

    # a finished output in the store is found finished: nothing is done again
    assert run_main(["dedup", "--in", f"{url}/cc/", "--out", f"{url}/deduped/"]) == 0
    assert "already complete" in capsys.readouterr().err


def test_reads_stream_and_fingerprint_by_etag(s3, tmp_path):
    """The first record of a 24 MiB object is read after fetching at most 8 MiB of it; an
    input's fingerprint is its size and ETag."""
    from cptkit.core.fingerprint import fingerprint, same_read
    from cptkit.core.remote import open_raw

    line = json.dumps({"id": "x", "text": "y" * 1000}) + "\n"
    big = tmp_path / "big.jsonl"
    big.write_text("".join(line.replace('"x"', f'"{i}"') for i in range(24_000)))
    upload(tmp_path, "s3://bkt/t2")
    with open_raw("s3://bkt/t2/big.jsonl") as f:
        assert json.loads(f.readline())["id"] == "0"
        assert f.cache.total_requested_bytes <= 2 * 4 * 2**20 < big.stat().st_size / 2  # two ranged reads at most
    inp = resolve_inputs("s3://bkt/t2/")[0]
    assert inp.path == "s3://bkt/t2/big.jsonl" and inp.size == big.stat().st_size
    assert next(read_records(inp))["id"] == "0"
    fp = fingerprint(inp)
    assert fp["etag"] and fp["mtime_ns"] is None
    assert same_read(fp, dict(fp)) and not same_read(fp, dict(fp, etag="0" * 32))


def test_a_second_writer_is_refused_by_a_conditional_put(s3, corpus, tmp_path, capsys):
    """Eight writers race for one output's lock: the store lets exactly one have it. A run finding
    another host's live lock stops in one line naming it, and writes nothing."""
    won, lost = [], []
    go = threading.Barrier(8)

    def take(i: int) -> None:
        r = RemoteOutput("s3://bkt/t3/out")
        r.host = f"node-{i}"  # another host each: no lock is taken over as stale
        go.wait()
        try:
            r.acquire(0, 1)
            won.append(i)
        except CptkitError as e:
            lost.append(str(e))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    assert all("another cptkit run is writing this output" in m for m in lost)
    rc = run_main(["dedup", "--in", corpus, "--out", "s3://bkt/t3/out", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"on node-{won[0]}" in err and "lock-00000-of-00001" in err
    assert [k for k in objects("s3://bkt/t3/out", data_only=False) if not k.startswith(".cptkit/lock-")] == []


@pytest.mark.slow(minutes=2)
def test_a_killed_run_resumes_to_byte_identical_output_and_redoes_an_edited_input(s3, corpus_records, tmp_path):
    """SIGKILL a run writing to the store once a task's marker is there; edit an input in place to the
    same size (a new ETag); the rerun redoes that task and its output equals a fresh local run's."""
    recs = [{k: r[k] for k in ("id", "text")} for r in corpus_records[:400]]
    recs += [dict(r, id=r["id"] + "-copy") for r in recs[::9]]
    inp = tmp_path / "in"
    for k in range(40):
        write_jsonl(inp / f"s{k:02d}.jsonl", recs[k::40])
    upload(inp, "s3://bkt/t4/in")
    args = ["dedup", "-q", "shard.max_records=3", "shard.task_bytes=0"]
    out = "s3://bkt/t4/out"
    proc = subprocess.Popen([*CLI, *args, "--in", "s3://bkt/t4/in/", "--out", out])
    deadline, f = time.time() + 180, fs()
    while time.time() < deadline and proc.poll() is None:
        f.invalidate_cache()
        if f.find("bkt/t4/out/.cptkit/done"):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    left = objects(out, data_only=False)
    assert "_SUCCESS" not in left and not any(".tmp" in k for k in left)
    for name, data in left.items():  # every shard there is whole
        if name.startswith("part-"):
            assert gzip.decompress(data)
    done = [k for k in left if k.startswith(".cptkit/done/")]
    assert 1 <= len(done) < 40
    # the first task's input, edited to the same size: its ETag changes, its size and name do not
    text = (inp / "s00.jsonl").read_text()
    edited = text.replace("a", "@", 1)
    assert edited != text and len(edited.encode()) == len(text.encode())
    (inp / "s00.jsonl").write_text(edited)
    upload(inp, "s3://bkt/t4/in")
    rerun = subprocess.run([*CLI, *args, "--in", "s3://bkt/t4/in/", "--out", out], capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "s00.jsonl changed" in " ".join(rerun.stderr.split())
    subprocess.run([*CLI, *args, "--in", str(inp), "--out", str(tmp_path / "fresh")], check=True, timeout=300)
    assert objects(out) == files(tmp_path / "fresh")
    m_out = json.loads(fs().cat_file("bkt/t4/out/_manifest.json"))
    m_ref = json.loads((tmp_path / "fresh" / "_manifest.json").read_text())
    assert m_out["counts"] == m_ref["counts"] and m_out["files"] == m_ref["files"]


def test_a_wrong_credential_and_a_missing_bucket_are_one_line(s3, corpus, tmp_path):
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "not-the-secret-0123456789"}
    r = subprocess.run([*CLI, "dedup", "--in", "s3://bkt/t1/cc/", "--out", str(tmp_path / "o")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("error: s3://bkt/t1/cc/: access denied by the store") and "AWS_SECRET_ACCESS_KEY" in r.stderr
    assert "not-the-secret-0123456789" not in r.stderr and s3.secret not in r.stderr
    assert not (tmp_path / "o").exists()
    r = subprocess.run([*CLI, "dedup", "--in", str(corpus), "--out", "s3://nobucket/out"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "s3://nobucket/out: no bucket 'nobucket' in the store" in r.stderr
    r = subprocess.run([*CLI, "dedup", "--in", "s3://nobucket/in/", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "s3://nobucket/in/: no bucket 'nobucket' in the store" in r.stderr, r.stderr


def test_bad_input_in_a_new_store_output_leaves_nothing(s3, tmp_path, capsys):
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": "x"}, {"id": "b"}])
    rc = run_main(["dedup", "--in", tmp_path / "in", "--out", "s3://bkt/t6/out", "--quiet"])
    assert rc == 2 and "a.jsonl:2: record 'b' has no 'text'" in capsys.readouterr().err
    assert objects("s3://bkt/t6/out", data_only=False) == {}


def test_file_urls_are_local_paths(tmp_path, capsys):
    """``file://`` in --in and --out is the local path: the same output as the plain paths give."""
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": "one two three"}, {"id": "b", "text": "one two three"}])
    assert run_main(["dedup", "--in", f"file://{tmp_path}/in", "--out", f"file://{tmp_path}/o1", "--quiet"]) == 0
    assert run_main(["dedup", "--in", tmp_path / "in", "--out", tmp_path / "o2", "--quiet"]) == 0
    assert files(tmp_path / "o1") == files(tmp_path / "o2") and (tmp_path / "o1" / "_SUCCESS").is_file()


def test_a_prefix_holding_other_objects_is_not_written_into(s3, tmp_path, capsys):
    fs().pipe_file("bkt/t7/out/notes.txt", b"someone else's")
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": "x"}])
    staging = Path(os.environ["CPTKIT_STAGING"])
    before = set(staging.iterdir())
    rc = run_main(["dedup", "--in", tmp_path / "in", "--out", "s3://bkt/t7/out", "--quiet"])
    assert set(staging.iterdir()) == before  # no staging directory left behind
    assert rc == 2 and "s3://bkt/t7/out: holds objects and is not a cptkit output" in capsys.readouterr().err
    assert list(objects("s3://bkt/t7/out", data_only=False)) == ["notes.txt"]  # its lock released, nothing added
