"""The framework's side of a step run: the typed config converted once, the frozen :class:`Run`
that carries the infrastructure settings and the recorded config, and ``_SUCCESS`` as the last
file any step writes into its output (observed from outside, on real runs)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_jsonl
from mixdata import build_stream, make_tokenizer

from cptkit.core.config import compose_step, to_dict
from cptkit.core.discovery import declaration, execute, step_module, step_names
from cptkit.core.fingerprint import config_hash
from cptkit.core.job import Job
from cptkit.core.redact import redact
from cptkit.core.run import LATER_KEYS, OneOf, Run, later_key

STEPS_DIR = Path(__file__).resolve().parent.parent / "cptkit" / "steps"

_WRITES: list[tuple[str, str]] | None = None  # (event, path) while a test records; None: off


def _audit(event: str, args: tuple) -> None:
    if _WRITES is None:
        return
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or \
            (mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writing:
            _WRITES.append(("open", os.path.abspath(os.fsdecode(args[0]))))
    elif event == "os.rename":  # os.rename and os.replace
        _WRITES.append(("rename", os.path.abspath(os.fsdecode(args[1]))))


sys.addaudithook(_audit)


def writes_into(out: Path, fn) -> list[str]:
    """The files ``fn()`` writes under ``out``, in order (opened for writing, or renamed onto)."""
    global _WRITES
    _WRITES = []
    try:
        fn()
        seen = list(_WRITES)
    finally:
        _WRITES = None
    root = str(out.resolve()) + os.sep
    return [os.path.relpath(p, root) for _, p in seen if p.startswith(root)]


def assert_success_is_last(out: Path, written: list[str]) -> None:
    assert written and written[-1] == "_SUCCESS", written[-5:]
    done = (out / "_SUCCESS").stat().st_mtime_ns
    later = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.stat().st_mtime_ns > done]
    assert not later, f"written after _SUCCESS: {later}"


def test_build_mix_writes_nothing_after_success(corpus_dir, corpus_records, tmp_path_factory, tmp_path):
    """The stream's manifest entry goes in through Job's hooks, not by rewriting the manifest."""
    tok = make_tokenizer(corpus_records, tmp_path_factory.mktemp("tok"))
    out = tmp_path / "mix"
    written = writes_into(out, lambda: build_stream(corpus_dir, tok, out, []))
    assert "_manifest.json" in written and written.count("_manifest.json") == 1
    assert_success_is_last(out, written)
    assert json.loads((out / "_manifest.json").read_text())["stream"]["domains"]  # the hook's addition


def test_a_map_step_writes_nothing_after_success(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"a{i}", "text": f"word {i} " * 20} for i in range(30)])
    write_jsonl(tmp_path / "in" / "b.jsonl", [{"id": f"b{i}", "text": f"more {i} " * 20} for i in range(10)])
    out = tmp_path / "out"
    step_module("corrupt")
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={out}", "quiet=true"])
    written = writes_into(out, lambda: execute("corrupt", cfg))
    assert any(w.startswith("part-") for w in written)
    assert_success_is_last(out, written)


def test_a_run_is_frozen_and_records_changes_as_copies(tmp_path):
    """Run.recording gives a copy (io.* changes the I/O settings too); the original is untouched."""
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": "one doc"}])
    step_module("corrupt")
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={tmp_path / 'o'}",
                                   "corrupt.ratio=0.25"])
    before = to_dict(cfg)
    ctx = Run.of(cfg)
    expected = {k: v for k, v in redact(before).items() if k != "arm"}
    del expected["io"]["html_extractor"]  # a LATER_KEYS key at its default is left out of the record
    assert to_dict(cfg) == before and ctx.record == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.quiet = True  # type: ignore[misc]
    other = ctx.recording("io.unique_ids", False).recording("corrupt.ratio", 0.5)
    assert other.io.unique_ids is False and other.record["io"]["unique_ids"] is False
    assert other.record["corrupt"]["ratio"] == 0.5 and ctx.record["corrupt"]["ratio"] == 0.25 and ctx.io.unique_ids
    assert config_hash(other.record) != config_hash(ctx.record)
    assert isinstance(Job(ctx).ctx, Run)


def test_keys_added_later_leave_the_record_at_their_unused_values_for_every_step(tmp_path):
    """LATER_KEYS: one table in the frame. An unset ``arm`` or an untied embedding is not in any step's
    record (outputs written before the key existed keep their hash); a set one is, and changes it."""
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": "one doc"}])
    io = [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={tmp_path / 'o'}"]
    for step, extra in (("corrupt", []), ("train", ["model=tiny_llama"])):
        step_module(step)
        plain = Run.of(compose_step(step, io + extra))
        assert "arm" not in plain.record
        labelled = Run.of(compose_step(step, [*io, *extra, "arm=rp0.2"]))
        assert labelled.record["arm"] == "rp0.2" and config_hash(labelled.record) != config_hash(plain.record)
    train = Run.of(compose_step("train", [*io, "model=tiny_llama"]))
    assert "tie_embeddings" not in train.record["model"] and "callbacks" not in train.record["train"]
    assert {"branch_from", "weights_from"}.isdisjoint(train.record["train"])
    tied = Run.of(compose_step("train", [*io, "model=tiny_llama", "model.tie_embeddings=true"]))
    assert tied.record["model"]["tie_embeddings"] is True
    # train.callbacks' default became null (it also takes a mapping): an explicit [] is still left out, and a
    # list of classes is recorded as before
    assert "callbacks" not in Run.of(compose_step("train", [*io, "train.callbacks=[]"])).record["train"]
    named = Run.of(compose_step("train", [*io, "train.callbacks=[a.b:C]"])).record["train"]["callbacks"]
    assert named == ["a.b:C"]


# Every key added after outputs were recorded without it, with its unused value, as core/run.py's one table
# held them before each owner declared its own (core/run.py: later_key): part of old outputs' identity.
RECORDED_LATER_KEYS = {
    "arm": None,
    "io.html_extractor": "resiliparse",
    "model.tie_embeddings": False,
    "train.weights_from": None,
    "train.branch_from": None,
    "train.callbacks": OneOf((None, [])),
    "train.distill": {"kl": 0.0, "on": "replay", "teacher": None},
    "mix.replay.source": "pool",
    "mix.replay.self": {"model": None, "docs": 256, "max_tokens": 256, "seed": 0, "topk": 0, "temperature": 1.0},
    "quality.plugins": [],
    "edu.plugins": [],
    "topics.plugins": [],
}


def schema_keys(cls: type, prefix: str = "") -> set[str]:
    """Every dotted key of a config dataclass, nested sections included."""
    keys = set()
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(sub):
            keys |= schema_keys(type(sub), f"{prefix}{f.name}.")
    return keys


def test_later_keys_are_declared_by_their_owners_with_their_unused_values():
    """With every step imported, the declared later keys are the recorded table: none lost, none changed."""
    for name in step_names():
        step_module(name)
    assert LATER_KEYS == RECORDED_LATER_KEYS
    later_key("train.weights_from", None)  # the same declaration again (a module imported twice) is fine
    with pytest.raises(ValueError, match="train.weights_from"):
        later_key("train.weights_from", "")


def test_importing_a_step_alone_declares_its_later_keys_before_it_records():
    """A CLI run, an executor member or a Ray worker imports one step module, then records its config
    (:meth:`Run.of`): that import alone declares every later key the step's config has."""
    for name in step_names():
        step_module(name)
    owners = {name: keys for name in step_names()
              if (keys := schema_keys(declaration(name).schema) & (set(LATER_KEYS) - {"arm", "io.html_extractor"}))}
    assert {"train", "build-mix", "score-quality", "label-topics"} <= set(owners)
    script = ("import sys\nfrom cptkit.core.discovery import step_module\nfrom cptkit.core.run import LATER_KEYS\n"
              "step_module(sys.argv[1])\nprint(' '.join(LATER_KEYS))")
    for name, keys in owners.items():
        alone = subprocess.run([sys.executable, "-c", script, name], capture_output=True, text=True, check=True)
        assert keys <= set(alone.stdout.split()), (name, keys - set(alone.stdout.split()))


def test_no_step_converts_or_mutates_its_config():
    """Every step's run takes (conf, ctx); none calls OmegaConf.to_object / set_struct / open_dict."""
    bad = []
    for p in sorted(STEPS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("to_object", "set_struct", "open_dict"):
                bad.append(f"{p.name}:{node.lineno} {node.attr}")
            if isinstance(node, ast.FunctionDef) and node.name == "run" and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", "") == "step" for d in node.decorator_list):
                if [a.arg for a in node.args.args] != ["conf", "ctx"]:
                    bad.append(f"{p.name}:{node.lineno} run({', '.join(a.arg for a in node.args.args)})")
    assert not bad, bad


def test_a_step_writes_its_own_files_through_job_and_cleans_up_after_success(tmp_path):
    """Side files and run state go through Job (inside OUT, never a file the protocol owns); the
    after-success hook runs once ``_SUCCESS`` exists, and again on a rerun that finds it finished."""
    from cptkit.core.job import Hooks
    from cptkit.core.output import is_finished

    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a", "text": "one doc"}])
    step_module("corrupt")
    out = tmp_path / "o"
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={out}"])
    seen: list[bool] = []
    hooks = Hooks(after_success=lambda job: seen.append(is_finished(job.out)))
    with Job(Run.of(cfg), hooks=hooks) as job:
        assert job.write_bytes("_removed.jsonl", b"x\n") == out / "_removed.jsonl"
        job.write_json("_stats.json", {"n": 1})
        assert job.state_path("cache/sig.npy") == out / ".cptkit" / "cache" / "sig.npy"
        assert job.file("tokens") == out / "tokens" and job.state_dir == out / ".cptkit"
        for bad in ("_SUCCESS", "_manifest.json", ".cptkit/x", "../x", str(tmp_path / "x"), ""):
            with pytest.raises(ValueError):
                job.file(bad)
        for bad in ("done/t.json", "tasks.json", "lock-00000-of-00001", "../x"):
            with pytest.raises(ValueError):
                job.state_path(bad)
        for task in job.pending():
            with job.writer(task) as w:
                w.write({"id": "a", "text": "one doc"})
            job.complete(task, w)
            assert seen == []  # not finished yet
        job.finish()
    assert seen == [True] and (out / "_removed.jsonl").read_bytes() == b"x\n"
    assert json.loads((out / "_stats.json").read_text()) == {"n": 1}
    with Job(Run.of(cfg), hooks=hooks) as job:
        job.finish()
    assert seen == [True, True]


def test_a_folder_written_in_one_go_is_unfinished_until_it_succeeds(tmp_path):
    """core.output.writing: an earlier ``_SUCCESS`` goes first, and a failure leaves none."""
    from cptkit.core.output import is_finished, writing

    out = tmp_path / "f"
    with writing(out):
        (out / "a.txt").write_text("a")
    assert is_finished(out)
    with pytest.raises(RuntimeError), writing(out):
        assert not is_finished(out)
        raise RuntimeError("killed")
    assert not is_finished(out)
