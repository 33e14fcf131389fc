"""The step declaration (one file per step: command, schema, runner) and the MapStep framework:
batching, per-task stats merged across tasks and runs, resume, summary."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, run_main, write_jsonl
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from outputs import read_manifest, shard_files
from typer.testing import CliRunner

import cptkit.steps
from cptkit.cli import app
from cptkit.core.config import compose_step, schema_of
from cptkit.core.discovery import declaration, step_help, step_module, step_names
from cptkit.core.errors import CptkitError
from cptkit.core.executor import EXECUTORS, split_executor_args
from cptkit.core.run import Run
from cptkit.core.step import STEPS, MapStep, Member, Phase, map_batches


def test_map_batches_cuts_batches_of_the_given_size_and_a_shorter_last_one():
    seen: list[int] = []

    def fn(batch, stats):
        seen.append(len(batch))
        stats["records"] += len(batch)
        return [r * 10 for r in batch]

    stats: Counter = Counter()
    assert list(map_batches(range(7), 3, fn, stats)) == [0, 10, 20, 30, 40, 50, 60]
    assert seen == [3, 3, 1] and stats == {"records": 7}
    assert list(map_batches([], 3, fn, stats)) == [] and seen == [3, 3, 1]


class Shout(MapStep):
    """A test step: upper-cases text, drops records whose id ends in 0, counts both."""

    name = "shout"
    stats_key = "shout"
    calls = 0

    def process(self, batch, stats):
        Shout.calls += 1
        stats["batches"] += 1
        for rec in batch:
            if rec["id"].endswith("0"):
                stats["dropped"] += 1
                continue
            stats["kept"] += 1
            yield {**rec, "text": rec["text"].upper()}

    def summary(self, total):
        return {"kept": total["kept"], "dropped": total["dropped"], "batches": total["batches"]}


def test_a_map_step_runs_tasks_merges_their_stats_and_resumes(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"a{i}", "text": f"doc {i}"} for i in range(25)])
    write_jsonl(tmp_path / "in" / "b.jsonl", [{"id": f"b{i}", "text": f"doc {i}"} for i in range(12)])
    out = tmp_path / "out"
    # any registered step's config gives the io/shard settings; the step itself is Shout
    step_module("corrupt")  # registers its schema
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={out}", "quiet=true",
                                   "shard.task_bytes=0"])  # a task per file (small files share one by default)
    res = Shout(OmegaConf.to_object(cfg), Run.of(cfg), batch_size=10).run()
    got = read_jsonl_dir(out)
    assert len(got) == 25 - 3 + 12 - 2 and all(r["text"].startswith("DOC ") for r in got)
    assert res["extra"] == {"kept": 32, "dropped": 5, "batches": 3 + 2}
    man = read_manifest(out)
    assert man["extra"] == res["extra"] and man["counts"]["records_out"] == 32
    markers = sorted((out / ".cptkit" / "done").glob("*.json"))
    assert [json.loads(m.read_text())["extra"]["shout"]["batches"] for m in markers] == [3, 2]
    # a rerun of the finished output does no work and reports the same
    calls = Shout.calls
    assert Shout(OmegaConf.to_object(cfg), Run.of(cfg), batch_size=10).run()["skipped"] and Shout.calls == calls
    # an unfinished output: the task whose marker is gone is redone, the other's stats are reused
    markers[1].unlink()
    (out / "_SUCCESS").unlink()
    res2 = Shout(OmegaConf.to_object(cfg), Run.of(cfg), batch_size=10).run()
    assert Shout.calls == calls + 2 and res2["extra"] == res["extra"]
    assert read_jsonl_dir(out) == got


def test_a_map_step_gets_its_typed_config_and_batch_size_from_it(tmp_path):
    """``self.conf`` is the step's dataclass (validated), ``batch_key`` finds the batch size in it,
    and ``setup`` runs once before any work."""
    from cptkit.steps.corrupt import CorruptConfig, CorruptJob

    class Probe(MapStep):
        batch_key = "corrupt.batch_size"

        def setup(self):
            self.ready = isinstance(self.conf, CorruptJob) and isinstance(self.conf.corrupt, CorruptConfig)

        def process(self, batch, stats):
            return batch

    step_module("corrupt")
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path}]", f"io.output={tmp_path / 'o'}", "corrupt.batch_size=7"])
    conf, ctx = OmegaConf.to_object(cfg), Run.of(cfg)
    p = Probe(conf, ctx)
    assert p.ready and p.batch_size == 7 and Probe(conf, ctx, batch_size=3).batch_size == 3


def test_every_step_module_declares_the_step_its_file_names():
    """cptkit/steps/x_y.py declares step x-y: schema registered for conf/x_y.yaml, a runner, a help."""
    names = step_names()
    assert len(names) >= 17 and "build-mix" in names and "dedup" in names
    repo = ConfigStore.instance().repo
    for name in names:
        decl = declaration(name)
        assert decl.name == name and schema_of(name) is decl.schema and callable(decl.body)
        assert f"_schema_{name.replace('-', '_')}.yaml" in repo
        assert step_help(name)[:1].isupper() and not step_help(name).startswith((f"{name}:", f"``cptkit {name}``"))


def test_a_step_name_declared_twice_is_an_error():
    from cptkit.core.errors import CptkitError
    from cptkit.core.step import step
    from cptkit.steps.corrupt import CorruptJob

    step_module("corrupt")

    def run(conf, ctx):  # a second module would declare "corrupt" again
        return None

    run.__module__ = "plugins.my_corrupt"
    try:
        step("corrupt", CorruptJob)(run)
    except CptkitError as e:
        assert "step 'corrupt' is declared twice: in cptkit.steps.corrupt and in plugins.my_corrupt" in str(e)
    else:
        raise AssertionError("a duplicate step name was accepted")
    assert STEPS.get("corrupt").body.__module__ == "cptkit.steps.corrupt"


def test_cptkit_help_lists_every_step_without_importing_any():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom cptkit.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nprint(r.output)\n"
            "print('IMPORTED', [m for m in sys.modules if m.startswith('cptkit.steps.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    listing, imported = out.rsplit("IMPORTED", 1)
    assert imported.strip() == "[]"
    for name in step_names():
        assert f"  {name} " in listing
    assert "Tokenize, order and pack curated shards" in listing  # build-mix's docstring head
    # pipeline order, not alphabetical
    assert listing.index("  expand-queries ") < listing.index("  retrieve ") < listing.index("  dedup ")


PLUGIN = (Path(__file__).parent / "fixtures" / "plugins" / "shout_words.py").read_text()  # docs/architecture.md


def test_a_new_step_is_one_file(tmp_path, monkeypatch):
    """A step module dropped into the steps package path (here a plugin directory) is a command
    with its options, a --help listing its config keys, validation and a run; no YAML needed."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "shout_words.py").write_text(PLUGIN)
    monkeypatch.setattr(cptkit.steps, "__path__", [*cptkit.steps.__path__, str(plugins)])
    try:
        runner = CliRunner()
        r = runner.invoke(app, ["--help"])
        assert "shout-words" in r.output and "Upper-case every record's text" in r.output
        r = runner.invoke(app, ["shout-words", "--help"])
        assert r.exit_code == 0 and "--in" in r.output and "--skip-bad-lines" in r.output
        assert "shout.suffix=!" in r.output and "appended to every text" in r.output
        write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"a{i}", "text": f"doc {i}"} for i in range(6)])
        r = runner.invoke(app, ["shout-words", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "-q",
                                "shout.suffix=?"])
        assert r.exit_code == 0, r.output
        assert [x["text"] for x in read_jsonl_dir(tmp_path / "out")] == [f"DOC {i}?" for i in range(6)]
        man = read_manifest(tmp_path / "out")
        assert man["step"] == "shout-words" and man["extra"] == {"shouted": 6}
        r = runner.invoke(app, ["shout-words", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "o2"),
                                "shout.suffix=abcd"])
        assert r.exit_code != 0 and "shout.suffix=abcd: at most 3 characters" in str(r.exception or r.output)
    finally:
        STEPS.unregister("shout-words")
        sys.modules.pop("cptkit.steps.shout_words", None)


def test_cli_order_comes_from_the_step_declarations(tmp_path, monkeypatch):
    """`cptkit --help` lists steps by their declared ``order`` (read from the source, nothing
    imported); a step without one comes last, by name."""
    from cptkit.core.discovery import ordered, step_order

    assert step_order("demo-corpus") < step_order("retrieve") < step_order("build-mix") < step_order("evaluate")
    assert all(step_order(n) is not None for n in step_names())  # every built-in step is placed
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "aaa_plugin.py").write_text(PLUGIN.replace("shout-words", "aaa-plugin"))
    monkeypatch.setattr(cptkit.steps, "__path__", [*cptkit.steps.__path__, str(plugins)])
    names = ordered(step_names())
    assert names[0] == "demo-corpus" and names[-1] == "aaa-plugin"
    r = CliRunner().invoke(app, ["--help"])
    listed = [ln.split()[0] for ln in r.output.splitlines() if ln.startswith("  ") and ln.split()]
    assert listed.index("retrieve-index") < listed.index("retrieve") < listed.index("evaluate") \
        < listed.index("evaluate-compare") < listed.index("serve-llm") < listed.index("aaa-plugin")


PLUGINS = Path(__file__).parent / "fixtures" / "plugins"
RARE = (PLUGINS / "rare_words.py").read_text()  # docs/architecture.md
RARE_TEXTS = ["z", "q", "w", ""]  # x is in 4 documents, y in 2: with rare.max_docs=1 both go


@pytest.fixture
def rare_words(tmp_path, monkeypatch):
    """The two-phase plugin step on the steps path, and two input files (two tasks)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "rare_words.py").write_text(RARE)
    monkeypatch.setattr(cptkit.steps, "__path__", [*cptkit.steps.__path__, str(plugins)])
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "a0", "text": "x y z"}, {"id": "a1", "text": "x q"}])
    write_jsonl(tmp_path / "in" / "b.jsonl", [{"id": "b0", "text": "x y w"}, {"id": "b1", "text": "x"}])
    yield ["rare-words", "--in", str(tmp_path / "in"), "shard.task_bytes=0"]
    STEPS.unregister("rare-words")
    sys.modules.pop("cptkit.steps.rare_words", None)


def test_a_multi_phase_step_runs_its_phases_as_waves_of_local_workers(tmp_path, rare_words):
    """executor.workers=2 runs the declared phases as two waves of two forked slices (every slice
    counts before any writes); the output is the one-process run's, byte for byte."""
    runner = CliRunner()
    r = runner.invoke(app, [*rare_words, "--out", str(tmp_path / "one"), "-q"])
    assert r.exit_code == 0, r.output
    assert [x["text"] for x in read_jsonl_dir(tmp_path / "one")] == RARE_TEXTS
    r = runner.invoke(app, [*rare_words, "--out", str(tmp_path / "two"), "-q", "executor.workers=2"])
    assert r.exit_code == 0, r.output
    assert shard_files(tmp_path / "two") == shard_files(tmp_path / "one") and len(shard_files(tmp_path / "one")) == 2
    man = read_manifest(tmp_path / "two")
    assert man["config"]["shard"]["count"] == 2 and man["config"]["rare"]["phase"] == "all"
    assert man["counts"]["records_in"] == 4


def test_a_multi_phase_step_on_slurm_is_one_dependent_job_array_per_phase(tmp_path, rare_words, monkeypatch):
    """executor=slurm submits a job array per phase, each after the previous (afterok); running
    the submitted commands slice by slice gives the one-process run's output."""
    log = tmp_path / "sbatch"
    log.mkdir()
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nn=$(( $(ls "$SBATCH_LOG" | wc -l) + 1 ))\n'
                    'for a in "$@"; do printf "%s\\0" "$a"; done > "$SBATCH_LOG/$n"\necho "$((100 + n))"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_LOG", str(log))
    out = tmp_path / "slurm"
    r = CliRunner().invoke(app, [*rare_words, "--out", str(out), "-q", "executor=slurm", "executor.workers=2"])
    assert r.exit_code == 0, r.output
    calls = [(log / str(k)).read_text().split("\0")[:-1] for k in (1, 2)]
    assert not (log / "3").exists() and not out.exists()  # submitted, not run here
    assert "--array=0-1" in calls[0] and not any(a.startswith("--dependency") for a in calls[0])
    assert "--array=0-1" in calls[1] and "--dependency=afterok:101" in calls[1]
    for call, phase in zip(calls, ("count", "write"), strict=True):
        words = shlex.split(call[call.index("--wrap") + 1])
        assert words[1:4] == ["-m", "cptkit", "rare-words"] and f"rare.phase={phase}" in words
        for i in range(2):  # what each array member runs
            args = [w.replace("$SLURM_ARRAY_TASK_ID", str(i)) for w in words[3:]]
            assert run_main(args) == 0
    r = CliRunner().invoke(app, [*rare_words, "--out", str(tmp_path / "one"), "-q"])
    assert shard_files(out) == shard_files(tmp_path / "one") and (out / "_SUCCESS").is_file()


def test_a_plan_is_waves_of_typed_members_that_render_their_overrides():
    """dedup's plan over 3 slices: map, reduce, then the final phase led by slice 0; each member is
    a slice of a phase and renders its process's overrides from typed settings."""
    plan = declaration("dedup").plan(compose_step("dedup", ["dedup.cluster=mapreduce"]), 3)
    assert [(w.number, w.phase.name, w.first, w.last) for w in plan] == \
        [(1, "map", 0, 2), (2, "reduce", 0, 2), (3, "final", 0, 0), (4, "final", 1, 2)]
    assert plan[3].members[0] == Member(1, 3, Phase("final", {"dedup.phase": "final"}, leader=True))
    assert plan[3].members[0].overrides() == ["shard.index=1", "shard.count=3", "dedup.phase=final"]
    typed = Phase("p", {"a.name": "map", "a.n": 3, "a.r": 0.5, "a.on": True, "a.off": None, "a.s": "two words",
                        "a.t": "true", "a.d": "7"})
    assert Member(0, 1, typed).shared() == ["shard.count=1", "a.name=map", "a.n=3", "a.r=0.5", "a.on=true",
                                            "a.off=null", "a.s='two words'", "a.t='true'", "a.d='7'"]
    assert len({typed, Phase("p", dict(typed.settings))}) == 1  # hashable, by value


def test_a_new_executor_is_one_class_registered_by_name(tmp_path, rare_words, monkeypatch):
    """tests/fixtures/plugins/inline_executor.py (docs/architecture.md, "Add an executor"): unknown
    until imported; then executor=inline (and executor=inline_executor:Inline) runs rare-words' two
    phases as waves of two members, and the output is the one-process run's, byte for byte."""
    with pytest.raises(CptkitError, match=r"executor='inline': must be one of local, ray, slurm "):
        split_executor_args(["executor=inline"])
    monkeypatch.syspath_prepend(str(PLUGINS))
    import inline_executor

    try:
        runner = CliRunner()
        r = runner.invoke(app, [*rare_words, "--out", str(tmp_path / "one"), "-q"])
        assert r.exit_code == 0, r.output
        for name in ("inline", "inline_executor:Inline"):
            assert split_executor_args([f"executor={name}"])[0].kind == name
            out = tmp_path / name.replace(":", "-")
            r = runner.invoke(app, [*rare_words, "--out", str(out), "-q", f"executor={name}", "executor.workers=2"])
            assert r.exit_code == 0, r.output
            assert shard_files(out) == shard_files(tmp_path / "one") and len(shard_files(out)) == 2
            assert read_manifest(out)["config"]["shard"]["count"] == 2
        assert EXECUTORS.get("inline") is inline_executor.Inline
        doc = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text().split("### Add an executor")[1]
        code = doc.split("```python\n")[1].split("```")[0]
        fixture = (PLUGINS / "inline_executor.py").read_text()
        assert all(ln.split("  #")[0].rstrip() in fixture for ln in code.splitlines())  # the recipe is the fixture
    finally:
        EXECUTORS.unregister("inline")
        sys.modules.pop("inline_executor", None)
