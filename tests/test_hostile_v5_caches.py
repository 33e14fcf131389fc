"""Hostile input v5, caches that check themselves (issue 53, cases 7-9): a B0 or GGUF cache entry is
sealed with every file's size and sha256, so one cut short is rebuilt instead of reported "cached"
(and failing later, blaming something else), and a link planted as an entry is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _eval_model import make_tiny
from mixdata import TWO_DOMAINS, build_stream

from cptkit.core import cache
from cptkit.core.errors import CptkitError

ROOT = Path(__file__).resolve().parents[1]
B0_ARGS = ["train.max_steps=3", "train.eval_every=1", "train.micro_batch=2", "train.threads=1", "train.warmup=1",
           "quiet=true"]


def cut(path: Path, keep: float = 0.5) -> None:
    """Truncate ``path`` to a fraction of its bytes (a copy interrupted, a disk filled up)."""
    with open(path, "r+b") as f:
        f.truncate(int(path.stat().st_size * keep))


def test_seal_and_damage_see_cuts_edits_additions_and_links(tmp_path, monkeypatch):
    monkeypatch.setenv("CPTKIT_CACHE", str(tmp_path / "cache"))
    e = cache.entry("kind", "KEY")
    (e / "sub").mkdir(parents=True)
    (e / "a.bin").write_bytes(b"x" * 1000)
    (e / "sub" / "b.txt").write_text("hello")
    assert cache.damage(e) == "no integrity record"
    cache.seal(e)
    assert cache.damage(e) is None
    cut(e / "a.bin")
    assert cache.damage(e) == "a.bin is 500 bytes, 1,000 when it was written"
    (e / "a.bin").write_bytes(b"y" * 1000)  # same size, other bytes
    assert "changed since it was written" in cache.damage(e)
    (e / "a.bin").write_bytes(b"x" * 1000)
    assert cache.damage(e) is None
    (e / "sub" / "b.txt").unlink()
    (e / "sub" / "b.txt").symlink_to(tmp_path / "elsewhere")
    assert cache.damage(e) == "sub/b.txt is not a regular file"
    (e / "sub" / "b.txt").unlink()
    assert cache.damage(e) == "sub/b.txt is missing"
    # a link planted as an entry, or as a kind's directory, is refused
    (tmp_path / "foreign").mkdir()
    (tmp_path / "cache" / "kind" / "LINK").symlink_to(tmp_path / "foreign")
    with pytest.raises(CptkitError, match="LINK: is a symbolic link inside the cache"):
        cache.entry("kind", "LINK")
    (tmp_path / "cache" / "other").symlink_to(tmp_path / "foreign")
    with pytest.raises(CptkitError, match="other: is a symbolic link inside the cache"):
        cache.entry("other", "KEY")


@pytest.fixture(scope="module")
def tiny_b0(corpus_dir, tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Llama and a two-domain stream built with its tokenizer."""
    base = tmp_path_factory.mktemp("b0")
    model, _, _ = make_tiny(base / "model")
    stream = base / "stream"
    build_stream(corpus_dir, model, stream, [*TWO_DOMAINS, "mix.budget_tokens=3000", "mix.seq_len=64",
                                             "mix.eval_docs=2"])
    return model, stream


def b0(model: Path, stream: Path, link: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CPTKIT_CACHE": str(cache_dir)}
    link.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "cptkit", "b0", "--base", str(model), "--stream", str(stream),
                           "--link", str(link), "--group", "en", "--", *B0_ARGS],
                          capture_output=True, text=True, env=env, timeout=600)


def test_a_truncated_b0_is_trained_again(tiny_b0, tmp_path):
    """Case 7: a cached B0 whose model.safetensors was cut short used to be reported "cached", rc 0, and
    failed only in the next train; now the entry is checked against its record and trained again."""
    from safetensors.torch import load_file

    model, stream = tiny_b0
    r = b0(model, stream, tmp_path / "xp" / "b0", tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    [entry] = (tmp_path / "cache" / "b0").iterdir()
    [weights] = entry.rglob("model.safetensors")
    whole = {k: v.clone() for k, v in load_file(weights).items()}  # not mapped: the file is cut below
    cut(weights)
    r = b0(model, stream, tmp_path / "xp" / "b0", tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"B0 {entry.name}: the cached {entry} is damaged (model/model.safetensors is " in r.stderr, r.stderr[-3000:]
    assert "training it again" in r.stderr and "cached at" not in r.stderr
    again = load_file(weights)  # whole again, and the same weights (the same seeded run)
    assert again.keys() == whole.keys() and all(torch.equal(again[k], whole[k]) for k in whole)
    assert (entry / cache.INTEGRITY).is_file() and cache.damage(entry) is None


def test_a_link_planted_as_b0s_cache_entry_is_refused(tiny_b0, tmp_path):
    """Case 9: a link planted as $CPTKIT_CACHE/b0/KEY was followed and B0 trained into the foreign
    directory; now it is one line, exit 2, and the foreign directory is untouched."""
    from cptkit.training.b0 import b0_key

    model, stream = tiny_b0
    key = b0_key(str(model), stream, B0_ARGS)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (tmp_path / "cache" / "b0").mkdir(parents=True)
    (tmp_path / "cache" / "b0" / key).symlink_to(foreign, target_is_directory=True)
    r = b0(model, stream, tmp_path / "xp" / "b0", tmp_path / "cache")
    err = r.stderr.strip()
    assert list(foreign.iterdir()) == []
    assert r.returncode == 2 and len(err.splitlines()) == 1, r.stderr[-3000:]
    assert f"b0/{key}: is a symbolic link inside the cache" in err and "Traceback" not in err
    assert not (tmp_path / "xp" / "b0").exists()


def test_a_truncated_gguf_cache_entry_is_converted_again(tiny_b0, tmp_path, monkeypatch):
    """Case 8: a GGUF cache entry whose model.safetensors was cut short failed every later load with
    an error naming the healthy .gguf, forever; now it is converted again, and loads bit-identical."""
    from cptkit.models import gguf_cache, lm

    model, _ = tiny_b0
    q = tmp_path / "m.gguf"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "export-gguf", "--model", str(model), "--out", str(q),
                        "export.dtype=f16", "-q"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.setenv("CPTKIT_CACHE", str(tmp_path / "cache"))
    first = {k: v.clone() for k, v in lm.load_causal_lm(str(q)).state_dict().items()}  # not mapped: cut below
    [entry] = (tmp_path / "cache" / "gguf").iterdir()
    assert (entry / gguf_cache.DONE).exists()
    cut(entry / "model.safetensors")
    for _ in range(2):  # converted again once, then used as it is
        again = {k: v.clone() for k, v in lm.load_causal_lm(str(q)).state_dict().items()}
        assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
        assert cache.damage(entry) is None
    # an entry written before integrity records (no record) is checked by its safetensors headers
    (entry / cache.INTEGRITY).unlink()
    cut(entry / "model.safetensors", 0.9)
    assert lm.resolve_loadable(str(q)) == (str(entry), None) and cache.damage(entry) is None
    assert torch.equal(lm.load_causal_lm(str(q)).state_dict()["lm_head.weight"], first["lm_head.weight"])
    # a link planted as the entry is refused, not loaded
    foreign = tmp_path / "foreign"
    entry.rename(foreign)
    entry.symlink_to(foreign, target_is_directory=True)
    with pytest.raises(CptkitError, match="is a symbolic link inside the cache"):
        lm.resolve_loadable(str(q))


def test_a_b0_killed_mid_run_resumes_from_its_last_checkpoint(tiny_b0, tmp_path):
    """A B0 killed after a checkpoint (a pre-empted cluster job, a reboot) continues from it when rerun,
    to the same losses as an uninterrupted build, instead of training from step 1 again; its
    checkpoints are gone once it finishes."""
    import json
    import signal
    import time

    model, stream = tiny_b0
    args = ["train.max_steps=40", *B0_ARGS[1:]]

    def cmd(cache_dir: Path) -> tuple[list[str], dict]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CPTKIT_CACHE": str(cache_dir), "PYTHONHASHSEED": "0"}
        return [sys.executable, "-m", "cptkit", "b0", "--base", str(model), "--stream", str(stream), "--link",
                str(cache_dir.parent / "xp" / "b0"), "--group", "en", "--save-every", "2", "--", *args], env

    def steps(entry: Path) -> list[tuple[int, float]]:
        rows = [json.loads(x) for x in (entry / "metrics.jsonl").read_text().splitlines() if x.strip()]
        return [(r["step"], r["loss"]) for r in rows if "loss" in r]  # the steps, not the eval rows

    def step_one(entry: Path) -> str:  # step 1's row, with its wall seconds
        return next(x for x in (entry / "metrics.jsonl").read_text().splitlines() if '"seconds"' in x)

    (tmp_path / "ref" / "xp").mkdir(parents=True)
    c, env = cmd(tmp_path / "ref" / "cache")
    assert subprocess.run(c, env=env, capture_output=True, text=True, timeout=600).returncode == 0
    [ref] = (tmp_path / "ref" / "cache" / "b0").iterdir()

    (tmp_path / "run" / "xp").mkdir(parents=True)
    c, env = cmd(tmp_path / "run" / "cache")
    p = subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 300
    while not list((tmp_path / "run" / "cache").glob("b0/*/checkpoints/latest")):  # a checkpoint is complete
        assert p.poll() is None and time.time() < deadline, p.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    [entry] = (tmp_path / "run" / "cache" / "b0").iterdir()
    killed = steps(entry)
    assert not (entry / "_SUCCESS").exists() and len(killed) < 40, killed
    first = step_one(entry)
    r = subprocess.run(c, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = steps(entry)
    assert got == steps(ref)  # the same run, step for step
    # resumed, not trained again: the rows up to the checkpoint are the killed run's, timings and all
    assert step_one(entry) == first
    assert got[0][0] == 1 and (entry / "_SUCCESS").exists() and not (entry / "checkpoints").exists()
