"""Spine behaviours (CLI, errors, resume, stdout, config) proven through ``cptkit dedup``."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, run_main, write_jsonl

CLI = [sys.executable, "-c", "from cptkit.cli import main; main()"]


def cli(argv: list, capsys) -> tuple[int, str, str]:
    """``cptkit ARGV`` in-process: (exit code, stdout, stderr)."""
    code = run_main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture()
def shards(corpus_records, tmp_path) -> Path:
    """Three real-text shards, one exact duplicate across shards."""
    recs = [{k: r[k] for k in ("id", "text", "lang")} for r in corpus_records[:240]]
    recs.append({"id": "copy-of-0", "text": recs[0]["text"], "lang": recs[0]["lang"]})
    d = tmp_path / "in"
    for k in range(3):
        write_jsonl(d / f"s{k}.jsonl", recs[k::3])
    return d


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("case", ["json", "id", "utf8", "empty"])
def test_bad_input_names_file_and_line(shards, tmp_path, capsys, case):
    bad = shards / "s2.jsonl"
    lines = bad.read_bytes().splitlines(keepends=True)
    if case == "json":
        lines[4] = b'{"id": "x", "text": "unterminated\n'
    elif case == "id":
        lines[4] = b'{"text": "no id here"}\n'
    elif case == "utf8":
        lines[4] = b'{"id": "x", "text": "caf\xe9"}\n'
    else:
        lines = []
    bad.write_bytes(b"".join(lines))
    out = tmp_path / "out"
    code, stdout, err = cli(["dedup", "--in", shards, "--out", out, "-q"], capsys)
    assert code == 2 and stdout == ""
    line = _one_error_line(err)
    want = {"json": "s2.jsonl:5: malformed JSON", "id": "s2.jsonl:5: record has no 'id'",
            "utf8": "s2.jsonl:5: invalid UTF-8", "empty": "s2.jsonl: input is empty"}[case]
    assert want in line
    assert not out.exists()  # nothing half-written: not even the signatures of s0, s1


def test_missing_input_path(tmp_path, capsys):
    code, _, err = cli(["dedup", "--in", tmp_path / "nope", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "nope: no such file or directory" in _one_error_line(err)
    assert not (tmp_path / "out").exists()


def test_skip_bad_lines_counts_them(shards, tmp_path, capsys):
    bad = shards / "s1.jsonl"
    bad.write_bytes(bad.read_bytes() + b'{"id": 1, "text": "x"}\nnot json\n{"id": "ok-extra", "text": "fine"}\n')
    out = tmp_path / "out"
    code, _, err = cli(["dedup", "--in", shards, "--out", out, "--skip-bad-lines", "-q"], capsys)
    assert code == 0, err
    m = json.loads((out / "_manifest.json").read_text())
    assert m["counts"]["bad_lines_skipped"] == 2
    assert m["counts"]["records_in"] == 242 and m["counts"]["records_out"] == 241
    ids = [r["id"] for r in read_jsonl_dir(out)]
    assert "ok-extra" in ids and "copy-of-0" not in ids


def test_stdout_streams_kept_records(shards, tmp_path):
    proc = subprocess.run([*CLI, "dedup", "--in", str(shards), "--out", "-"], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    recs = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert len(recs) == 240 and "copy-of-0" not in {r["id"] for r in recs}
    assert b"cptkit dedup" in proc.stderr  # the summary goes to stderr, data alone to stdout
    assert not Path("-").exists()


def test_stdin_input_is_refused(tmp_path, capsys):
    code, _, err = cli(["dedup", "--in", "-", "--out", tmp_path / "o", "-q"], capsys)
    assert code == 2 and "stdin" in _one_error_line(err)
    assert not (tmp_path / "o").exists()


def test_cfg_job_prints_config(capsys):
    code, out, _ = cli(["dedup", "--cfg", "job", "dedup.ngram=5", "dedup.bands=16", "dedup.rows=8"], capsys)
    assert code == 0
    assert "dedup:\n  ngram: 5\n  threshold: 0.8\n  num_perm: 128\n  bands: 16\n  rows: 8\n" in out


def test_mistyped_key_is_named(tmp_path, capsys):
    code, _, err = cli(["dedup", "--in", tmp_path, "--out", tmp_path / "o", "dedup.thrshold=0.5"], capsys)
    assert code == 2
    assert "dedup.thrshold" in _one_error_line(err)


@pytest.mark.slow
def test_kill_resume_gives_identical_bytes(corpus_records, tmp_path):
    """SIGKILL a run after its first finished task; the rerun must equal an uninterrupted run."""
    recs = [{k: r[k] for k in ("id", "text", "lang")} for r in corpus_records]
    recs += [{"id": f"{r['id']}~copy", "text": r["text"] + " (copy)", "lang": r["lang"]} for r in recs[::7]]
    inp = tmp_path / "in"
    for k in range(40):
        write_jsonl(inp / f"s{k:02d}.jsonl.gz", recs[k::40])
    args = ["dedup", "--in", str(inp), "-q", "shard.max_records=3", "shard.task_bytes=0"]  # 40 tasks, one per file
    ref = tmp_path / "ref"
    subprocess.run([*CLI, *args, "--out", str(ref)], check=True, timeout=300)

    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, *args, "--out", str(out)])
    done = out / ".cptkit" / "done"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if done.exists() and any(done.iterdir()):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "_SUCCESS").exists()
    n_done = len(list(done.iterdir()))
    assert 1 <= n_done < 40

    subprocess.run([*CLI, *args, "--out", str(out)], check=True, timeout=300)
    files = sorted(p.relative_to(ref) for p in ref.rglob("*") if p.is_file() and p.name != "_manifest.json"
                   and ".cptkit" not in p.parts)
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()
                           and p.name != "_manifest.json" and ".cptkit" not in p.parts)
    assert len([f for f in files if f.name.startswith("part-")]) > 40
    for f in files:
        assert (out / f).read_bytes() == (ref / f).read_bytes(), f
    m_ref, m_out = (json.loads((d / "_manifest.json").read_text()) for d in (ref, out))
    assert m_ref["counts"] == m_out["counts"] and m_ref["extra"] == m_out["extra"]
    assert m_ref["files"] == m_out["files"]
    removed = (ref / "_removed.jsonl").read_text().splitlines()
    assert len(removed) >= len(recs[::7]) * 0.9
    assert sum(1 for f in files if f.name.startswith("part-")
               for _ in gzip.open(ref / f)) == m_ref["counts"]["records_out"]
