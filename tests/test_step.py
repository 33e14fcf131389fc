"""The MapStep framework: batching, per-task stats merged across tasks and runs, resume, summary."""

from __future__ import annotations

import json
from collections import Counter

from conftest import read_jsonl_dir, write_jsonl

from cptkit.config import compose_step
from cptkit.step import MapStep, map_batches
from cptkit.steps import step_module


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
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path / 'in'}]", f"io.output={out}", "quiet=true"])
    res = Shout(cfg, batch_size=10).run()
    got = read_jsonl_dir(out)
    assert len(got) == 25 - 3 + 12 - 2 and all(r["text"].startswith("DOC ") for r in got)
    assert res["extra"] == {"kept": 32, "dropped": 5, "batches": 3 + 2}
    man = json.loads((out / "_manifest.json").read_text())
    assert man["extra"] == res["extra"] and man["counts"]["records_out"] == 32
    markers = sorted((out / ".cptkit" / "done").glob("*.json"))
    assert [json.loads(m.read_text())["extra"]["shout"]["batches"] for m in markers] == [3, 2]
    # a rerun of the finished output does no work and reports the same
    calls = Shout.calls
    assert Shout(cfg, batch_size=10).run()["skipped"] and Shout.calls == calls
    # an unfinished output: the task whose marker is gone is redone, the other's stats are reused
    markers[1].unlink()
    (out / "_SUCCESS").unlink()
    res2 = Shout(cfg, batch_size=10).run()
    assert Shout.calls == calls + 2 and res2["extra"] == res["extra"]
    assert read_jsonl_dir(out) == got


def test_a_map_step_gets_its_typed_config_and_batch_size_from_it(tmp_path):
    """``self.conf`` is the step's dataclass (validated), ``batch_key`` finds the batch size in it,
    and ``setup`` runs once before any work."""
    from cptkit.steps.corrupt import CorruptConfig, CorruptJob

    class Probe(MapStep):
        name = "probe"
        batch_key = "corrupt.batch_size"

        def setup(self):
            self.ready = isinstance(self.conf, CorruptJob) and isinstance(self.conf.corrupt, CorruptConfig)

        def process(self, batch, stats):
            return batch

    step_module("corrupt")
    cfg = compose_step("corrupt", [f"io.inputs=[{tmp_path}]", f"io.output={tmp_path / 'o'}", "corrupt.batch_size=7"])
    p = Probe(cfg)
    assert p.ready and p.batch_size == 7 and Probe(cfg, batch_size=3).batch_size == 3
