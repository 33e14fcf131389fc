"""Hostile input v5, disk full while a checkpoint is saved (issue 53, case 10): one line naming the
checkpoint, exit 2, no temporary checkpoint left behind; a rerun with space resumes and finishes,
and removes what a run killed while saving left. The disk is a small tmpfs the test mounts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tmpfs
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["model.hidden=32", "model.layers=2", "model.heads=2", "train.micro_batch=4", "train.threads=1",
         "train.lr=3e-3", "train.warmup=2", "train.max_steps=4", "train.save_every=2", "train.engine=torch", "-q"]


@pytest.fixture
def small_disk(tmp_path):
    """A 192 KiB tmpfs at ``tmp_path/disk``, to fill; skips where it cannot mount."""
    with tmpfs(tmp_path / "disk", "size=192k") as disk:
        yield disk


def leftovers(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if ".tmp" in p.name)


def test_disk_full_while_saving_a_checkpoint_is_one_line_and_leaves_nothing(small_disk, corpus_dir, corpus_records,
                                                                             tmp_path):
    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    stream = tmp_path / "stream"
    build_stream(corpus_dir, tok, stream, [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=64",
                                           "mix.eval_docs=4"])
    out = small_disk / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "cptkit.cli", "train", "--in", str(stream), "--out", str(out), *SMALL]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    err = r.stderr.strip()
    assert r.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, r.stderr[-3000:]
    assert "no space left on the device" in err and "checkpoints/step00000002/cptkit_state.pt" in err, err
    assert leftovers(out) == []
    # more room: the rerun finishes, and what a run killed while saving left is gone too
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    killed = out / "checkpoints" / ".step00000002.tmp-4194000"
    killed.mkdir(parents=True)
    (killed / "cptkit_state.pt").write_bytes(b"\0" * 100_000)
    r = subprocess.run([*cmd, "train.resume=true"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "_SUCCESS").is_file() and leftovers(out) == []
