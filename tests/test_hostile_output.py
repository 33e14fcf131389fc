"""Hostile output directories and many small inputs (issue "Hostile input v4", items 7, 11, 12):
links planted in an unfinished output are never written through, SIGTERM is reported and resumes
cleanly, dead writers' temporary files go when the output is reopened, and small input files share
tasks (a handful of state files, the same records as one file, changed files still caught)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, run_main, write_jsonl

CLI = [sys.executable, "-c", "from cptkit.cli import main; main()"]
PER_FILE = "shard.task_bytes=0"  # a task per input file (small files share one by default)


def cli(argv: list, capsys) -> tuple[int, str, str]:
    """``cptkit ARGV`` in-process: (exit code, stdout, stderr)."""
    code = run_main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path -> bytes), manifests and run state excluded."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and ".cptkit" not in p.parts and p.name != "_manifest.json"}


def tmps(d: Path) -> list[Path]:
    """Temporary files (``.NAME.tmp-PID``) anywhere under ``d``."""
    return sorted(p for p in d.rglob(".*.tmp-*"))


def copy_step(inp: Path, out: Path, *extra: str) -> list:
    """corrupt with ratio 0: a record-to-record step that copies its input."""
    return ["corrupt", "--in", inp, "--out", out, "-q", "corrupt.ratio=0", *extra]


def texts(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = [f"w{k}" for k in range(500)]
    return [{"id": f"r{seed}-{i:05d}", "text": " ".join(rng.choice(words) for _ in range(12)) + f" n{i}"}
            for i in range(n)]


# -- 7. no write through a link ------------------------------------------------------------------------
def test_links_planted_in_an_unfinished_output_are_never_written_through(tmp_path, capsys):
    inp = tmp_path / "in"
    for k in range(2):
        write_jsonl(inp / f"s{k}.jsonl", texts(20, seed=k))
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert cli(copy_step(inp, out, PER_FILE, "shard.count=2", "shard.index=0"), capsys)[0] == 0
    assert not (out / "_SUCCESS").exists()  # unfinished: slice 1 is still to run
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = {  # dangling links to files outside --out, where slice 1 writes
        "_SUCCESS": "success", "_manifest.json": "manifest", "README.md": "card",
        "part-00001-0000.jsonl.gz": "shard", f".part-00001-0000.jsonl.gz.tmp-{os.getpid()}": "shard-tmp",
        ".cptkit/done/00001.json": "marker", f".cptkit/done/.00001.json.tmp-{os.getpid()}": "marker-tmp",
    }
    for name, target in planted.items():
        (out / name).symlink_to(outside / target)
    code, _, err = cli(copy_step(inp, out, PER_FILE, "shard.count=2", "shard.index=1"), capsys)
    assert code == 0, err
    assert list(outside.iterdir()) == []
    assert (out / "_SUCCESS").is_file() and not any(p.is_symlink() for p in out.rglob("*"))
    assert cli(copy_step(inp, fresh, PER_FILE), capsys)[0] == 0
    assert tree(out) == tree(fresh)


def test_a_linked_run_state_directory_is_refused(tmp_path, capsys):
    inp = write_jsonl(tmp_path / "in.jsonl", texts(5))
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".cptkit").symlink_to(outside)
    code, _, err = cli(copy_step(inp, out), capsys)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and ".cptkit: is a symbolic link" in lines[0], err
    assert list(outside.iterdir()) == []


# -- 11. SIGTERM, and dead writers' temporary files ---------------------------------------------------
@pytest.mark.slow(minutes=1)
def test_sigterm_says_what_was_kept_and_resumes_to_the_same_bytes(corpus_records, tmp_path):
    recs = [{k: r[k] for k in ("id", "text")} for r in corpus_records]
    inp = tmp_path / "in"
    for k in range(40):
        write_jsonl(inp / f"s{k:02d}.jsonl.gz", recs[k::40])
    args = ["dedup", "--in", str(inp), "-q", "shard.max_records=3", "dedup.workers=2", PER_FILE]
    ref = tmp_path / "ref"
    subprocess.run([*CLI, *args, "--out", str(ref)], check=True, timeout=300)
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, *args, "--out", str(out)], stderr=subprocess.PIPE, text=True)
    done = out / ".cptkit" / "done"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if done.exists() and any(done.glob("*.json")):
            os.kill(proc.pid, signal.SIGTERM)
            break
        time.sleep(0.002)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143, err
    kept = len(list(done.glob("*.json")))
    assert err.strip() == (f"terminated (SIGTERM): {kept} of 40 tasks of {out} are finished and kept; "
                           "rerun the same command to resume")
    assert 1 <= kept < 40 and not (out / "_SUCCESS").exists()
    assert not (out / ".cptkit" / "lock-00000-of-00001").exists()
    subprocess.run([*CLI, *args, "--out", str(out)], check=True, timeout=300)
    assert tmps(out) == []
    assert tree(out) == tree(ref)


def test_dead_writers_temporary_files_go_when_the_output_is_reopened(tmp_path, capsys):
    inp = tmp_path / "in"
    for k in range(3):
        write_jsonl(inp / f"s{k}.jsonl", texts(10, seed=k))
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    array = [PER_FILE, "shard.count=3"]
    assert cli(copy_step(inp, out, *array, "shard.index=0"), capsys)[0] == 0
    dead = subprocess.Popen(["true"])
    dead.wait()
    sleeper = subprocess.Popen(["sleep", "600"])  # alive, but holds no lock of the output: not a writer
    holder = subprocess.Popen(["sleep", "600"])  # alive and holding slice 2's lock: a writer at work
    try:
        state = out / ".cptkit"
        (state / "lock-00002-of-00003").write_text(json.dumps({
            "pid": holder.pid, "host": socket.gethostname(), "started": time.time(), "index": 2, "count": 3}))
        gone = [out / f".part-00001-0000.jsonl.gz.tmp-{dead.pid}", state / f".ids-00001.json.tmp-{dead.pid}",
                state / f".lines-00001.jsonl.zst.tmp-{dead.pid}", state / "done" / f".00001.json.tmp-{sleeper.pid}"]
        kept = [state / f".sig-00002.npy.tmp-{holder.pid}", out / f".part-00002-0000.jsonl.gz.tmp-{holder.pid}"]
        for p in gone + kept:
            p.write_text("half written")
        assert cli(copy_step(inp, out, *array, "shard.index=1"), capsys)[0] == 0
        assert tmps(out) == sorted(kept)
    finally:
        for p in (sleeper, holder):
            p.kill()
            p.wait()
    assert cli(copy_step(inp, out, *array, "shard.index=2"), capsys)[0] == 0  # the holder's lock is stale now
    assert tmps(out) == [] and (out / "_SUCCESS").is_file()
    assert cli(copy_step(inp, fresh, PER_FILE), capsys)[0] == 0
    assert tree(out) == tree(fresh)


# -- 12. small files share tasks ------------------------------------------------------------------------
def test_two_thousand_tiny_files_make_a_handful_of_tasks_and_the_records_of_one_file(tmp_path, capsys):
    recs = texts(2000)
    inp = tmp_path / "in"
    for i, r in enumerate(recs):
        write_jsonl(inp / f"f{i // 100:02d}" / f"t{i:04d}.jsonl", [r])
    one = write_jsonl(tmp_path / "one" / "all.jsonl", recs)
    out, ref = tmp_path / "out", tmp_path / "ref"
    code, _, err = cli(["dedup", "--in", inp, "--out", out, "-q"], capsys)
    assert code == 0, err
    assert len(list((out / ".cptkit" / "done").iterdir())) <= 3
    assert len([p for p in (out / ".cptkit").rglob("*") if p.is_file()]) <= 12
    assert cli(["dedup", "--in", one, "--out", ref, "-q"], capsys)[0] == 0
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(read_jsonl_dir(out), key=key) == sorted(read_jsonl_dir(ref), key=key) == sorted(recs, key=key)
    again = tmp_path / "again"  # the layout is deterministic: a second run writes the same bytes
    assert cli(["dedup", "--in", inp, "--out", again, "-q"], capsys)[0] == 0
    assert tree(again) == tree(out)

    edited = inp / "f07" / "t0700.jsonl"  # a tiny file changed after the output was finished
    write_jsonl(edited, [{"id": "r0-00700", "text": "an edited text"}])
    code, _, err = cli(["dedup", "--in", inp, "--out", out, "-q"], capsys)
    assert code == 2 and "is a finished output of inputs that changed since (" in err and "t0700.jsonl changed" in err


def test_a_changed_tiny_file_redoes_only_its_group(tmp_path, capsys):
    recs = texts(600)
    inp = tmp_path / "in"
    for i, r in enumerate(recs):
        write_jsonl(inp / f"t{i:04d}.jsonl", [r])
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    array = ["shard.task_bytes=8000", "shard.count=2"]  # ~100 files per task, two slices
    assert cli(copy_step(inp, out, *array, "shard.index=0"), capsys)[0] == 0
    layout = json.loads((out / ".cptkit" / "tasks.json").read_text())
    assert 4 <= len(layout) <= 12 and all(len(g) > 1 for g in layout)
    done = sorted(p.name for p in (out / ".cptkit" / "done").iterdir())
    # grow the first file: grouped anew, every later group would shift; the output keeps its groups
    write_jsonl(inp / "t0000.jsonl", [{"id": "r0-00000", "text": "a much longer edited text " * 20}])
    code, _, err = cli(copy_step(inp, out, *array, "shard.index=0"), capsys)
    assert code == 0, err
    assert "t0000.jsonl changed" in err and "redoing the 1 task(s)" in " ".join(err.split())
    assert json.loads((out / ".cptkit" / "tasks.json").read_text()) == layout
    assert sorted(p.name for p in (out / ".cptkit" / "done").iterdir()) == done
    assert cli(copy_step(inp, out, *array, "shard.index=1"), capsys)[0] == 0
    assert cli(copy_step(inp, fresh, "shard.task_bytes=8000"), capsys)[0] == 0
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(read_jsonl_dir(out), key=key) == sorted(read_jsonl_dir(fresh), key=key)
    man = json.loads((out / "_manifest.json").read_text())
    assert man["counts"]["records_in"] == man["counts"]["records_out"] == 600


def test_a_slice_opening_as_another_slice_makes_the_output_joins_it(tmp_path, monkeypatch):
    """Slices of one array start together: one makes OUT, then its state directory. A slice that finds
    OUT already there and looks inside between the two (made here deterministic: the other slice's state
    appears while it lists OUT) joins the run, instead of calling OUT "not a cptkit output"."""
    from cptkit.core.output import STATE_DIR, OutputDir

    out = tmp_path / "out"
    out.mkdir()  # the other slice's mkdir
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self == out:
            (out / STATE_DIR).mkdir(exist_ok=True)  # the other slice gets there meanwhile
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    o = OutputDir(out, step="dedup", config={}, identity="h", index=1, count=4)
    o.open([])
    o.release()
    assert not o.created  # another slice's output: never its to empty
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")  # a directory of someone else's files: still refused
    with pytest.raises(Exception, match="exists and is not a cptkit output"):
        OutputDir(tmp_path / "foreign", step="dedup", config={}, identity="h", index=1, count=4).open([])
