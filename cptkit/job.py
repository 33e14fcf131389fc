"""One run of a step: its tasks, its output directory, resume markers, progress and manifest.

The output protocol (docs/records.md):

* ``OUT/part-TTTTT-KKKK.jsonl.gz``: data shards; task ``T`` writes shards ``K = 0, 1, ...``.
* ``OUT/.cptkit/done/TTTTT.json``: a task's completion marker (counts, files, seconds).
* ``OUT/_manifest.json`` and ``OUT/_SUCCESS``: written once every task is done.
* Other ``OUT/_*`` files are a step's side outputs (removed ids, run files, indexes).

A rerun skips tasks that have a marker and redoes the others from scratch, so a killed run
resumes to byte-identical output. If a run fails on bad input and created ``OUT`` itself, it
removes ``OUT``: nothing half-written is left behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from cptkit import __version__
from cptkit.config import redact, to_dict
from cptkit.errors import CptkitError
from cptkit.progress import log, make_progress, print_summary, setup_logging
from cptkit.records import Record
from cptkit.shards import (
    STDIO,
    InputFile,
    ReadStats,
    ShardWriter,
    atomic_write_bytes,
    atomic_write_json,
    read_records,
    resolve_inputs,
)

STATE_DIR = ".cptkit"
SUCCESS = "_SUCCESS"
MANIFEST = "_manifest.json"


@dataclass
class Task:
    """A unit of resumable work: by default one input shard."""

    index: int
    inputs: list[InputFile]
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.index:05d}"


@dataclass
class TaskResult:
    records_in: int = 0
    records_out: int = 0
    bad: int = 0
    files: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def config_hash(cfg: dict) -> str:
    """Hash of the config that determines the output (not I/O locations or verbosity)."""
    keep = {k: v for k, v in cfg.items() if k not in ("io", "quiet", "overrides")}
    keep["shard"] = {k: v for k, v in cfg.get("shard", {}).items() if k not in ("index", "count")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Job:
    """Context manager around a step run. Use :meth:`pending` / :meth:`read` / :meth:`writer`."""

    def __init__(self, cfg: DictConfig, *, inputs: list[InputFile] | None = None, tasks: list[Task] | None = None,
                 needs_inputs: bool = True):
        self.cfg = cfg
        self.step = str(cfg.step)
        self.quiet = bool(cfg.get("quiet", False))
        setup_logging(self.quiet)
        self.config = to_dict(cfg)
        if inputs is None and needs_inputs:
            inputs = resolve_inputs(list(cfg.io.inputs))
        self.inputs = inputs or []
        self.tasks = tasks if tasks is not None else [Task(i, [f]) for i, f in enumerate(self.inputs)]
        if any(f.path == STDIO for f in self.inputs) and len(self.tasks) > 1:
            raise CptkitError("stdin (-) cannot be combined with other inputs")
        out = cfg.io.output
        if out is None:
            raise CptkitError("no output given: pass --out PATH (a directory, or - for stdout)")
        self.stdout = str(out) == STDIO
        self.out = Path(str(out))
        self.shard_index, self.shard_count = int(cfg.shard.index), int(cfg.shard.count)
        if not 0 <= self.shard_index < self.shard_count:
            raise CptkitError(f"shard.index={self.shard_index} must be in [0, shard.count={self.shard_count})")
        self.hash = config_hash(self.config)
        self.created = False
        self.already_done = False
        self.t0 = time.time()
        self.results: dict[str, TaskResult] = {}
        self.progress = make_progress(self.quiet)
        self._bar: Any = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Job:
        if not self.stdout:
            self._prepare_output()
        self.progress.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.progress.stop()
        if exc_type is None or self.stdout:
            return
        for tmp in self.out.glob(".*.tmp-*"):
            tmp.unlink(missing_ok=True)
        if issubclass(exc_type, CptkitError) and self.created and self.shard_count == 1:
            shutil.rmtree(self.out, ignore_errors=True)

    def _prepare_output(self) -> None:
        state = self.out / STATE_DIR
        if (self.out / SUCCESS).exists():
            if self.config["io"].get("overwrite"):
                shutil.rmtree(self.out)
            else:
                old = json.loads((self.out / MANIFEST).read_text()).get("config_hash")
                if old != self.hash:
                    raise CptkitError(f"{self.out}: holds a finished output of another config; "
                                      "pass io.overwrite=true or choose another --out")
                self.already_done = True
                return
        if self.out.exists() and not state.exists() and any(self.out.iterdir()):
            raise CptkitError(f"{self.out}: exists and is not a cptkit output; refusing to write into it")
        self.created = not self.out.exists()
        (state / "done").mkdir(parents=True, exist_ok=True)
        hash_file = state / "config_hash"
        if hash_file.exists() and hash_file.read_text() != self.hash:
            if not self.config["io"].get("overwrite"):
                raise CptkitError(f"{self.out}: an unfinished run with another config is here; "
                                  "pass io.overwrite=true or choose another --out")
            shutil.rmtree(self.out)
            (state / "done").mkdir(parents=True)
        if not hash_file.exists():  # never rewritten in place: array members read it concurrently
            atomic_write_bytes(hash_file, self.hash.encode())

    # -- tasks -----------------------------------------------------------------------------
    def mine(self) -> list[Task]:
        """The tasks of this process's slice (``shard.index`` of ``shard.count``)."""
        return [t for t in self.tasks if t.index % self.shard_count == self.shard_index]

    def marker(self, task: Task) -> Path:
        return self.out / STATE_DIR / "done" / f"{task.name}.json"

    def is_done(self, task: Task) -> bool:
        return not self.stdout and self.marker(task).exists()

    def pending(self) -> list[Task]:
        """Tasks of this slice that still need work; finished ones are reported and skipped."""
        if self.already_done:
            log.info("%s: already complete, nothing to do", self.out)
            return []
        mine = self.mine()
        todo = [t for t in mine if not self.is_done(t)]
        if len(todo) < len(mine):
            log.info("resuming: %d of %d tasks already done", len(mine) - len(todo), len(mine))
        total = sum(f.size for t in todo for f in t.inputs)
        self._bar = self.progress.add_task(self.step, total=total or None)
        return todo

    def read(self, task: Task, stats: ReadStats | None = None) -> Iterator[Record]:
        """Read a task's input records, advancing the progress bar and the task's counters."""
        res = self.results.setdefault(task.name, TaskResult())
        skip = bool(self.cfg.io.skip_bad_lines)
        for inp in task.inputs:
            st = stats or ReadStats()
            seen = 0
            for rec in read_records(inp, skip_bad=skip, stats=st):
                res.records_in += 1
                yield rec
                if res.records_in % 256 == 0 and self._bar is not None:
                    self.progress.update(self._bar, advance=st.bytes - seen)
                    seen = st.bytes
            res.bad += st.bad
            if self._bar is not None:
                self.progress.update(self._bar, advance=max(inp.size - seen, 0))

    def add_bar(self, description: str, total: int | None) -> Callable[[int], None]:
        """A progress bar for a phase that is not record reading; returns ``advance(n)``."""
        bar = self.progress.add_task(description, total=total)
        return lambda n=1: self.progress.update(bar, advance=n)

    def writer(self, task: Task, prefix: str = "part") -> ShardWriter:
        """A shard writer for ``task``: ``part-TTTTT-KKKK.jsonl.gz``; stale shards are removed."""
        if self.stdout:
            return ShardWriter(STDIO)
        for pattern in (f"{prefix}-{task.name}-*", f".{prefix}-{task.name}-*.tmp-*"):
            for stale in self.out.glob(pattern):  # a killed run's shards of this task
                stale.unlink()
        sc = self.cfg.shard
        return ShardWriter(self.out, f"{prefix}-{task.name}", compression=str(sc.compression),
                           max_bytes=int(sc.max_bytes), max_records=int(sc.max_records))

    def complete(self, task: Task, writer: ShardWriter | None = None, **extra: Any) -> None:
        """Mark ``task`` done (after its writer is closed)."""
        res = self.results.setdefault(task.name, TaskResult())
        if writer is not None:
            res.records_out += writer.records
            res.files += writer.files
        res.extra.update(extra)
        if not self.stdout:
            atomic_write_json(self.marker(task), {"task": task.name, "inputs": [f.path for f in task.inputs],
                                                  **res.__dict__})

    def run_map(self, fn: Callable[[Iterator[Record]], Iterator[Record]]) -> None:
        """Apply ``fn`` (records in → records out) to every pending task, task by task."""
        for task in self.pending():
            with self.writer(task) as w:
                for rec in fn(self.read(task)):
                    w.write(rec)
            self.complete(task, w)

    # -- the end ---------------------------------------------------------------------------
    def all_results(self) -> dict[str, dict]:
        if self.stdout:
            return {k: v.__dict__ for k, v in self.results.items()}
        done = {}
        for p in sorted((self.out / STATE_DIR / "done").glob("*.json")):
            done[p.stem] = json.loads(p.read_text())
        return done

    def finish(self, extra: dict[str, Any] | None = None, title: str | None = None) -> dict[str, Any]:
        """Write the manifest and ``_SUCCESS`` when every task is done; print the summary."""
        self.progress.stop()
        seconds = time.time() - self.t0
        if self.already_done:
            manifest = json.loads((self.out / MANIFEST).read_text())
            return manifest["counts"] | {"seconds": seconds, "skipped": True}
        results = self.all_results()
        counts = {
            "records_in": sum(r["records_in"] for r in results.values()),
            "records_out": sum(r["records_out"] for r in results.values()),
            "bad_lines_skipped": sum(r["bad"] for r in results.values()),
        }
        mine = {t.name: self.results[t.name] for t in self.mine() if t.name in self.results}
        here_in = sum(r.records_in for r in mine.values())
        rows: dict[str, Any] = {
            "records in": here_in,
            "records out": sum(r.records_out for r in mine.values()),
            "bad lines skipped": sum(r.bad for r in mine.values()),
            **(extra or {}),
            "seconds": seconds,
            "records/s": (here_in or sum(r.records_out for r in mine.values())) / seconds if seconds > 0 else 0.0,
        }
        complete = self.stdout or all(t.name in results for t in self.tasks)
        if complete and not self.stdout:
            manifest = {
                "step": self.step,
                "version": __version__,
                "config": redact(self.config),
                "config_hash": self.hash,
                "inputs": [{"path": f.path, "size": f.size} for f in self.inputs],
                "counts": counts,
                "files": sorted(f for r in results.values() for f in r["files"]),
                "extra": extra or {},
                "timings": {"started": self.t0, "finished": time.time(), "seconds_last_run": seconds,
                            "seconds_tasks": {k: r.get("extra", {}).get("seconds") for k, r in results.items()}},
            }
            atomic_write_json(self.out / MANIFEST, manifest)
            (self.out / SUCCESS).write_text("")
        elif not self.stdout:
            log.info("slice %d/%d done; %d of %d tasks finished overall", self.shard_index, self.shard_count,
                     len(results), len(self.tasks))
        print_summary(title or f"cptkit {self.step}", rows, self.quiet)
        return counts | {"seconds": seconds, "extra": extra or {}, "output": str(self.out)}
