"""The task runner of a step run: its tasks, reading, writers, progress, on an :class:`OutputDir`.

A run's inputs are grouped into tasks (consecutive input files of up to ``shard.task_bytes``
bytes; a bigger file is a task of its own), or the step gives its own. :class:`Job` opens the
output (:mod:`cptkit.core.output`: lock, identity, markers, manifest), keeps the task groups of
the output's first run, redoes the tasks that read a changed input (or everything, when the
step's tasks share state), and gives the step its verbs: :meth:`Job.pending` (this slice's
unfinished tasks), :meth:`Job.read` (records, with the duplicate-id check), :meth:`Job.writer`
(atomic shards), :meth:`Job.complete`, :meth:`Job.in_workers` (tasks in forked processes),
:meth:`Job.run_map` and :meth:`Job.finish`.

A rerun skips tasks that have a marker and redoes the others from scratch, so a killed run
resumes to byte-identical output. SIGTERM unwinds a run as Ctrl-C does
(:mod:`cptkit.core.signals`).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cptkit.core import remote, signals
from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.fingerprint import cache as hash_cache
from cptkit.core.fingerprint import config_hash, fingerprint_path
from cptkit.core.output import OutputDir, Task, TaskResult
from cptkit.core.progress import log, make_progress, print_summary, setup_logging
from cptkit.core.records import Record
from cptkit.core.redact import redact
from cptkit.core.run import Run
from cptkit.core.shards import (
    OWNER_PID,
    STDIO,
    InputFile,
    ReadStats,
    ShardWriter,
    group_inputs,
    read_records,
)
from cptkit.core.workers import in_workers

__all__ = ["Hooks", "Job", "Task", "TaskResult"]

V = TypeVar("V")
SKIPPED = "records_skipped"  # a task marker's extra: WARC records that are no text record, by reason


@dataclass
class Hooks:
    """What a step adds to :class:`Job`'s lifecycle, so that nothing touches an output after its
    ``_SUCCESS``: ``after_task(task, result)`` runs once a task's marker is written,
    ``before_complete(job)`` once every task is done (before the manifest),
    ``manifest_extra()`` returns top-level keys added to ``_manifest.json``, and
    ``after_success(job)`` runs once the output is finished (this run wrote its ``_SUCCESS``, or
    found it finished): what the finished output no longer needs (a training run's checkpoints)."""

    after_task: Callable[[Task, TaskResult], None] | None = None
    before_complete: Callable[[Job], None] | None = None
    manifest_extra: Callable[[], dict[str, Any]] | None = None
    after_success: Callable[[Job], None] | None = None


def step_inputs(ctx: Run) -> list[InputFile]:
    """The run's ``--in`` files, less any inside its ``--out`` (never read our own shards)."""
    inputs = ctx.resolve_inputs()
    out = remote.local_path(str(ctx.io.output)) if ctx.io.output is not None else None
    if out is not None and remote.is_url(out):
        own = str(out).rstrip("/") + "/"
        inputs = [f for f in inputs if not f.path.startswith(own)]
        if not inputs:
            raise CptkitError(f"--in {' '.join(map(str, ctx.io.inputs))}: holds no data files outside --out {out}")
    elif out is not None and str(out) != STDIO:
        own = os.path.realpath(str(out)) + os.sep
        inputs = [f for f in inputs if f.path == STDIO or not (f.real or os.path.realpath(f.path)).startswith(own)]
        if not inputs:
            raise CptkitError(f"--in {' '.join(map(str, ctx.io.inputs))}: holds no data files outside --out {out}")
    return inputs


class Job:
    """Context manager around a step run. Use :meth:`pending` / :meth:`read` / :meth:`writer`.

    ``independent_tasks=False`` says the tasks share state (a global phase, caches): then any
    changed input redoes the whole unfinished output instead of the tasks that read it.
    ``reads``: the other files and directories the run reads (models, tokenizers); a path that
    does not exist (a model name, not a file) is skipped. They key the output as the inputs do:
    one replaced in place redoes an unfinished output and makes a finished one refuse.
    ``identity``: the hash naming what the output holds (default: the recorded config's hash)."""

    def __init__(self, ctx: Run, *, inputs: list[InputFile] | None = None, tasks: list[Task] | None = None,
                 needs_inputs: bool = True, independent_tasks: bool = True, hooks: Hooks | None = None,
                 reads: list[Any] | None = None, identity: str | None = None):
        self.hooks = hooks or Hooks()
        self.ctx = ctx
        self.step = ctx.step
        self.quiet = ctx.quiet
        setup_logging(self.quiet)
        self.config = ctx.record  # what the manifest and results record: never a secret
        if inputs is None and needs_inputs:
            inputs = step_inputs(ctx)
        self.inputs = inputs or []
        self._default_tasks = tasks is None  # the inputs in groups (their layout is kept: tasks.json)
        self.tasks = tasks if tasks is not None else self._grouped()
        if any(f.path == STDIO for f in self.inputs) and len(self.tasks) > 1:
            raise CptkitError("stdin (-) cannot be combined with other inputs")
        self.output = OutputDir(ctx.io.output, step=self.step, config=self.config,
                                identity=identity if identity is not None else config_hash(self.config),
                                index=ctx.shard.index, count=ctx.shard.count, overwrite=ctx.io.overwrite,
                                lock_wait_s=ctx.io.lock_wait_s)
        self.stdout, self.out = self.output.stdout, self.output.path
        self.shard_index, self.shard_count = ctx.shard.index, ctx.shard.count
        self.independent = independent_tasks
        self.t0 = time.time()
        self.results: dict[str, TaskResult] = {}  # what this process counted, by task name
        self.progress = make_progress(self.quiet)
        self._bar: Any = None
        self._ids: set[int] = set()
        self._read_tasks: set[tuple[str, ...]] = set()
        self.reads = [str(p) for p in (reads or []) if p is not None and str(p) and os.path.exists(str(p))]
        self._fps = self._fingerprints()
        self._prev_term: Any = None
        hash_cache().save()

    @property
    def identity(self) -> str:
        """The hash naming what the output holds."""
        return self.output.identity

    @property
    def is_finished(self) -> bool:
        """The output was finished by an earlier run of the same identity: nothing to do."""
        return self.output.is_finished

    def reopen(self) -> None:
        """Extend a finished output (:meth:`OutputDir.reopen`)."""
        self.output.reopen()

    def unfinish(self) -> None:
        """Remove the reopened output's ``_SUCCESS`` (:meth:`OutputDir.unfinish`), once it may go."""
        self.output.unfinish()

    # -- a step's own files (OutputDir: inside OUT, mirrored to an object store) ------------
    @property
    def state_dir(self) -> Path:
        """The output's state directory ``OUT/.cptkit``, where a step keeps caches a rerun reuses."""
        return self.output.state()

    def file(self, name: str) -> Path:
        """The path of the side file ``OUT/name`` (:meth:`OutputDir.file`)."""
        return self.output.file(name)

    def state_path(self, name: str) -> Path:
        """The path of the run state ``OUT/.cptkit/name`` (:meth:`OutputDir.state_path`)."""
        return self.output.state_path(name)

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write the side file ``OUT/name`` atomically; returns its path."""
        return self.output.write_bytes(name, data)

    def write_json(self, name: str, obj: Any, indent: int | None = 2) -> Path:
        """Write the side file ``OUT/name`` as JSON atomically (secrets masked); returns its path."""
        return self.output.write_json(name, obj, indent=indent)

    def _grouped(self) -> list[Task]:
        """The default tasks: the inputs, in order, in groups of up to ``shard.task_bytes`` bytes."""
        groups = group_inputs(self.inputs, int(self.ctx.shard.task_bytes))
        return [Task(i, g) for i, g in enumerate(groups)]

    def _fingerprints(self) -> list[dict]:
        seen: dict[str, dict] = {}
        for f in [*self.inputs, *(f for t in self.tasks for f in t.inputs)]:
            fp = self.output.fp(f)
            seen.setdefault(fp["path"], fp)
        for path in self.reads:
            fp = fingerprint_path(path)
            seen.setdefault(fp["path"], fp)
        return list(seen.values())

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Job:
        signals.remember(self._kept)
        OWNER_PID.append(os.getpid())
        self._prev_term = signals.catch_sigterm()
        try:
            if not self.stdout:
                self._open()
            self.progress.start()
        except BaseException:
            self.output.release()
            self._leave()
            raise
        return self

    def _open(self) -> None:
        """Open the output; keep the first run's task groups; redo what read a changed input."""
        earlier = self.output.open(self._fps)
        kept = self._default_tasks and earlier.layout is not None and self._adopt(earlier.layout)
        if earlier.changed:
            kept = self._redo(earlier.changed, earlier.why) and kept
        layout = [[self.output.fp(f)["path"] for f in t.inputs] for t in self.tasks]
        self.output.start(layout if self._default_tasks and not kept else None)

    def _adopt(self, groups: list[list[str]]) -> bool:
        """Default tasks keep the groups of the output's first run (``.cptkit/tasks.json``, written
        once), so that an input that changed size since redoes its own group, not the groups after it."""
        by_path = {self.output.fp(f)["path"]: f for f in self.inputs}
        if sorted(p for g in groups for p in g) != sorted(by_path):
            return False
        self.tasks = [Task(i, [by_path[p] for p in g]) for i, g in enumerate(groups)]
        return True

    def _redo(self, changed: list[str], why: str) -> bool:
        """Inputs of an unfinished run changed: redo the tasks that read them (or everything, the
        default tasks grouped anew: returns False then)."""
        changed_set = set(changed)
        fp = self.output.fp
        hit = [t for t in self.tasks if any(fp(f)["path"] in changed_set for f in t.inputs)]
        in_tasks = {fp(f)["path"] for t in self.tasks for f in t.inputs}
        if not self.independent or not changed_set <= in_tasks:
            log.warning("%s; redoing the whole unfinished output", why)
            if self._default_tasks:
                self.tasks = self._grouped()
            self.output.clear()
            return False
        log.warning("%s; redoing the %d task(s) that read it", why, len(hit))
        for t in hit:
            self.output.forget(t)
        return True

    def _leave(self) -> None:
        """Undo what entering did to the process: the SIGTERM handler, the temporary files' pid."""
        signals.restore_sigterm(self._prev_term)
        self._prev_term = None
        if OWNER_PID:
            OWNER_PID.pop()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.progress.stop()
        try:
            self.output.close(exc_type)
        finally:
            self._leave()

    def _kept(self, what: str) -> str:
        """What an interrupted run kept, and how to resume it."""
        if self.stdout:
            return what
        done = self.output.done_count()
        if done is None:
            return f"{what}: nothing was kept in {self.out}"
        return (f"{what}: {done} of {len(self.tasks)} tasks of {self.out} are finished and kept; "
                "rerun the same command to resume")

    # -- tasks -----------------------------------------------------------------------------
    def mine(self) -> list[Task]:
        """The tasks of this process's slice (``shard.index`` of ``shard.count``)."""
        return [t for t in self.tasks if t.index % self.shard_count == self.shard_index]

    def is_done(self, task: Task) -> bool:
        """Whether ``task`` is finished (by this run, an earlier one or another slice)."""
        return self.output.is_complete(task)

    def pending(self) -> list[Task]:
        """Tasks of this slice that still need work; finished ones are reported and skipped."""
        if self.is_finished:
            return []
        mine = self.mine()
        todo = [t for t in mine if not self.is_done(t)]
        if len(todo) < len(mine):
            log.info("resuming: %d of %d tasks already done", len(mine) - len(todo), len(mine))
        total = sum(f.size for t in todo for f in t.inputs)
        self._bar = self.progress.add_task(self.step, total=total or None)
        return todo

    def read(self, task: Task, stats: ReadStats | None = None, plain_ids: bool = False,
             count: bool = True) -> Iterator[Record]:
        """Read a task's input records, advancing the progress bar and the task's counters
        (``count=False``: neither, for a pass of an earlier phase of a multi-phase step).

        With ``io.unique_ids`` (default) an id read twice in this run is an error naming its
        file and line (a task read again is not checked twice); so is, with ``plain_ids``, an id
        holding whitespace or a control character (a step writing ids into a tabular file)."""
        res = self.results.setdefault(task.name, TaskResult()) if count else TaskResult()
        io_cfg = self.ctx.io
        skip = io_cfg.skip_bad_lines
        key = (task.name, *(f.path for f in task.inputs))
        check_ids = io_cfg.unique_ids and key not in self._read_tasks
        self._read_tasks.add(key)
        ids = self._ids
        for inp in task.inputs:
            st = stats or ReadStats()
            seen, skipped_before = 0, dict(st.skipped)
            for rec in read_records(inp, skip_bad=skip, stats=st, plain_ids=plain_ids, **io_cfg.limits()):
                if check_ids:
                    h = hash(rec["id"])
                    if h in ids:
                        raise BadInput(inp.name, st.line, f"duplicate id {rec['id']!r} (read earlier in this run); "
                                       "ids must be unique (io.unique_ids=false turns this check off)")
                    ids.add(h)
                res.records_in += 1
                yield rec
                if res.records_in % 256 == 0 and self._bar is not None and count:
                    self.progress.update(self._bar, advance=st.bytes - seen)
                    seen = st.bytes
            res.bad += st.bad
            if st.skipped and count:  # WARC records that are no text record: counted by reason
                kept = res.extra.setdefault(SKIPPED, {})
                for why, n in st.skipped.items():
                    kept[why] = kept.get(why, 0) + n - skipped_before.get(why, 0)
            if self._bar is not None and count:
                self.progress.update(self._bar, advance=max(inp.size - seen, 0))

    def advance_read(self, task: Task) -> None:
        """Advance the step's progress bar over a task's inputs, read without :meth:`read`."""
        if self._bar is not None:
            self.progress.update(self._bar, advance=sum(f.size for f in task.inputs))

    def detach_progress(self) -> None:
        """In a forked worker process: report nothing to the progress display (the parent draws
        it; its refresh thread and lock did not survive the fork)."""
        self._bar = None
        self.progress = make_progress(quiet=True)

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
        sc = self.ctx.shard
        return ShardWriter(self.out, f"{prefix}-{task.name}", compression=str(sc.compression),
                           max_bytes=int(sc.max_bytes), max_records=int(sc.max_records))

    def in_workers(self, tasks: list[Task], fn: Callable[[Task], V], workers: int = 1) -> Iterator[tuple[Task, V]]:
        """``(task, fn(task))`` for every task, in this process or in up to ``workers`` forked
        processes (0: one per CPU; :func:`cptkit.core.workers.in_workers`). What a worker's
        :meth:`read` counted of a task comes back with its value, so :meth:`complete` records it."""
        def counted(task: Task) -> tuple[V, TaskResult | None]:
            return fn(task), self.results.get(task.name)

        for task, (value, res) in in_workers(workers, tasks, counted, init=self.detach_progress):
            if res is not None:
                self.results[task.name] = res
            yield task, value

    def complete(self, task: Task, writer: ShardWriter | None = None, *, result: TaskResult | None = None,
                 **extra: Any) -> None:
        """Mark ``task`` done (after its writer is closed), recording what it read, what ``writer``
        wrote and ``result``: what the task did besides (records written another way, other
        files; added to what :meth:`read` counted). ``extra``: entries of the marker's ``extra``."""
        res = self.results.setdefault(task.name, TaskResult())
        if writer is not None:
            res.records_out += writer.records
            res.files += writer.files
        if result is not None:
            res.add(result)
        res.extra.update(extra)
        self.output.complete(task, res)
        if self.hooks.after_task is not None:
            self.hooks.after_task(task, res)

    def run_map(self, fn: Callable[[Iterator[Record], Counter], Iterator[Record]],
                stats_key: str = "stats") -> Counter:
        """Apply ``fn(records, stats)`` to every pending task, task by task; store each task's
        ``stats`` (and seconds) in its marker. Returns the stats of every finished task merged
        (this run's, earlier runs' and other processes' of a sliced run)."""
        for task in self.pending():
            t0 = time.time()
            stats: Counter = Counter()
            with self.writer(task) as w:
                for rec in fn(self.read(task), stats):
                    w.write(rec)
            self.complete(task, w, seconds=time.time() - t0, **{stats_key: dict(stats)})
        return self.merged(stats_key)

    def merged(self, key: str) -> Counter:
        """The counters stored under ``key`` by every finished task, added up."""
        total: Counter = Counter()
        for res in self.all_results().values():
            total.update(res.get("extra", {}).get(key, {}))
        return total

    # -- the end ---------------------------------------------------------------------------
    def all_results(self) -> dict[str, dict]:
        """Every finished task's marker (to stdout: this run's results), by task name."""
        if self.stdout:
            return {k: v.__dict__ for k, v in self.results.items()}
        return self.output.results()

    def finish(self, extra: dict[str, Any] | None = None, title: str | None = None) -> dict[str, Any]:
        """Write the manifest, the data card and ``_SUCCESS`` when every task is done; print the summary."""
        self.progress.stop()
        seconds = time.time() - self.t0
        if self.is_finished:
            if self.hooks.after_success is not None:
                self.hooks.after_success(self)
            return self.output.manifest()["counts"] | {"seconds": seconds, "skipped": True}
        extra = redact(extra or {})
        results = self.all_results()
        counts = {
            "records_in": sum(r["records_in"] for r in results.values()),
            "records_out": sum(r["records_out"] for r in results.values()),
            "bad_lines_skipped": sum(r["bad"] for r in results.values()),
        }
        skipped = self.merged(SKIPPED)
        if skipped:  # archive records read but not records (WARC input): by reason
            counts[SKIPPED] = dict(sorted(skipped.items()))
        mine = {t.name: self.results[t.name] for t in self.mine() if t.name in self.results}
        here_in = sum(r.records_in for r in mine.values())
        rows: dict[str, Any] = {
            "records in": here_in,
            "records out": sum(r.records_out for r in mine.values()),
            "bad lines skipped": sum(r.bad for r in mine.values()),
            **({"archive records skipped": sum(skipped.values())} if skipped else {}),
            **extra,
            "seconds": seconds,
            "records/s": (here_in or sum(r.records_out for r in mine.values())) / seconds if seconds > 0 else 0.0,
        }
        complete = self.stdout or all(t.name in results for t in self.tasks)
        if complete and not self.stdout:
            if self.hooks.before_complete is not None:
                self.hooks.before_complete(self)
            self.output.finish(self.inputs, results, counts, extra, self.t0, seconds, self.hooks.manifest_extra)
            if self.hooks.after_success is not None:
                self.hooks.after_success(self)
        elif not self.stdout:
            log.info("slice %d/%d done; %d of %d tasks finished overall", self.shard_index, self.shard_count,
                     len(results), len(self.tasks))
        print_summary(title or f"cptkit {self.step}", rows, self.quiet)
        return counts | {"seconds": seconds, "extra": extra, "output": self.output.name}
