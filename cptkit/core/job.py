"""One run of a step: its tasks, its output directory, resume markers, lock, progress and manifest.

The output protocol (docs/records.md):

* ``OUT/part-TTTTT-KKKK.jsonl.gz``: data shards; task ``T`` writes shards ``K = 0, 1, ...``.
* ``OUT/.cptkit/done/TTTTT.json``: a task's completion marker (counts, files, seconds, and what the
  task read: each input's path, size, mtime_ns and sha256). A task is, by default, a group of
  consecutive input files of up to ``shard.task_bytes`` bytes (a bigger file is a task of its own);
  ``OUT/.cptkit/tasks.json`` keeps the groups of the output's first run.
* ``OUT/.cptkit/inputs.json``: every input of the run and every other file it reads (models,
  tokenizers: ``Job(reads=...)``), each with path, size, mtime_ns and sha256; ``config_hash``.
* ``OUT/.cptkit/lock-IIIII-of-NNNNN``: the lock of the run writing slice ``I`` (pid, host).
* ``OUT/_manifest.json``, ``OUT/README.md`` (a data card) and ``OUT/_SUCCESS``: written once
  every task is done.
* Other ``OUT/_*`` files are a step's side outputs (removed ids, run files, indexes).

A rerun skips tasks that have a marker and redoes the others from scratch, so a killed run
resumes to byte-identical output. A rerun whose inputs changed (by content: see :mod:`cptkit.core.fingerprint`) redoes the tasks that read a
changed file (or the whole output when the step's tasks share state), and refuses, naming the
file, when the input set changed or the output is finished. If a run fails on bad input and
created ``OUT`` (or found it empty), it empties it again: nothing half-written is left behind.

Nothing is written through a link: every file is written under a new temporary name
(``O_EXCL|O_NOFOLLOW``) and renamed over its final name. SIGTERM unwinds a run as Ctrl-C does
(:class:`Terminated`), and reopening an output removes the temporary files of writers that are gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit import __version__
from cptkit.core.config import IOConfig
from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.fingerprint import cache as hash_cache
from cptkit.core.fingerprint import content_hash, remove_dead_tmps
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
    atomic_write_bytes,
    atomic_write_json,
    group_inputs,
    open_new,
    read_records,
)

STATE_DIR = ".cptkit"
SUCCESS = "_SUCCESS"
MANIFEST = "_manifest.json"
INPUTS = "inputs.json"
TASKS = "tasks.json"
CARD = "README.md"


@dataclass
class Task:
    """A unit of resumable work: by default a group of consecutive input files (``shard.task_bytes``)."""

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


@dataclass
class Hooks:
    """What a step adds to :class:`Job`'s lifecycle, so that nothing touches an output after its
    ``_SUCCESS``: ``after_task(task, result)`` runs once a task's marker is written,
    ``before_complete(job)`` once every task is done (before the manifest), and
    ``manifest_extra()`` returns top-level keys added to ``_manifest.json``."""

    after_task: Callable[[Task, TaskResult], None] | None = None
    before_complete: Callable[[Job], None] | None = None
    manifest_extra: Callable[[], dict[str, Any]] | None = None


def config_hash(cfg: dict) -> str:
    """Hash of the config that determines the output (not I/O locations or verbosity)."""
    keep = {k: v for k, v in cfg.items() if k not in ("io", "quiet", "overrides")}
    keep["shard"] = {k: v for k, v in cfg.get("shard", {}).items() if k not in ("index", "count")}
    io = cfg.get("io", {})
    for key in ("max_record_chars", "oversize"):  # they change what is read
        if key in io and io[key] != IO_DEFAULTS.get(key):
            keep[f"io.{key}"] = io[key]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


IO_DEFAULTS = {"max_record_chars": IOConfig().max_record_chars, "oversize": IOConfig().oversize}


def fingerprint(inp: InputFile) -> dict[str, Any]:
    """What a task read from one input: absolute path, size, modification time (ns) and the
    sha256 of its contents (cached: :mod:`cptkit.core.fingerprint`)."""
    if inp.path == STDIO:
        return {"path": STDIO}
    return fingerprint_path(inp.path, inp.real)


def fingerprint_path(path: str | Path, real: str = "") -> dict[str, Any]:
    """:func:`fingerprint` of any file or directory (a model, a tokenizer): a directory's size is
    its files' bytes and its digest covers every file's name and contents. ``real``: the path
    with its links resolved, when known."""
    real = real or os.path.realpath(path)
    try:
        st = os.stat(real)
        if stat.S_ISREG(st.st_mode):  # a file: one stat (inputs can be many small files)
            return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "sha256": hash_cache().file_sha256(Path(real))}
        found = content_hash(real)
    except OSError:
        found = None
    if found is None:
        return {"path": real, "size": None, "mtime_ns": None}
    sha, size = found
    return {"path": real, "size": size, "mtime_ns": None, "sha256": sha}


def same_read(old: dict, new: dict) -> bool:
    """Whether two fingerprints of a path read the same bytes: by content when both have a digest
    (an edit that keeps the size and restores the mtime is a change; a touch is not), else by size and mtime."""
    if old.get("path") == STDIO or new.get("path") == STDIO:
        return False
    keys = ("size", "sha256") if "sha256" in old and "sha256" in new else ("size", "mtime_ns")
    return all(old.get(k) == new.get(k) for k in keys)


def _short(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def input_changes(old: list[dict], new: list[dict]) -> tuple[list[str], list[str]]:
    """(why the input SET differs, which same-path files changed) between two fingerprint lists."""
    o, n = {f["path"]: f for f in old}, {f["path"]: f for f in new}
    set_diff = [f"{_short(p)} is a new input" for p in n if p not in o]
    set_diff += [f"{_short(p)} is no longer an input" for p in o if p not in n]
    changed = [p for p in n if p in o and not same_read(o[p], n[p])]
    return set_diff, changed


def _describe_change(path: str, old: dict | None, new: dict) -> str:
    if path == STDIO:
        return "stdin (-) cannot be compared with what an earlier run read"
    if old is not None and old.get("size") != new.get("size"):
        return f"{_short(path)} changed (size {old.get('size')} -> {new.get('size')} bytes)"
    return f"{_short(path)} changed (its contents differ from what the earlier run read)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLock:
    """``OUT/.cptkit/lock-IIIII-of-NNNNN``: one writer per output slice (pid and host inside).

    Created atomically (a hard link of a complete temporary file). A lock whose process is dead
    on this host is stale and taken over; a live one makes the second run wait (``wait_s``) or
    refuse naming the holder. Runs with another ``shard.count`` conflict with every slice."""

    def __init__(self, out: Path, index: int, count: int, wait_s: float = 0.0):
        self.out, self.index, self.count, self.wait_s = out, index, count, wait_s
        self.dir = out / STATE_DIR
        self.path = self.dir / f"lock-{index:05d}-of-{count:05d}"
        self.host = socket.gethostname()
        self.held = False

    def _read(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _stale(self, info: dict) -> bool:
        return info.get("host") == self.host and (info.get("pid") == os.getpid() or not _alive(int(info.get("pid", 0))))

    def _holder(self) -> dict | None:
        """The live holder blocking us, or None once the lock is ours."""
        for other in self.dir.glob("lock-*"):
            if other == self.path or other.name.endswith(".tmp"):
                continue
            info = self._read(other)
            if info is None:
                continue
            if self._stale(info):
                other.unlink(missing_ok=True)
            elif int(info.get("count", 0)) != self.count:
                return info
        me = {"pid": os.getpid(), "host": self.host, "started": time.time(), "index": self.index,
              "count": self.count}
        tmp = self.dir / f".{self.path.name}.{self.host}.{os.getpid()}.tmp"
        with open_new(tmp) as f:
            f.write(json.dumps(me).encode())
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                    self.held = True
                    return None
                except FileExistsError:
                    info = self._read(self.path)
                    if info is None:  # being written this instant: let the writer finish
                        time.sleep(0.05)
                        info = self._read(self.path)
                    if info is not None and not self._stale(info):
                        return info
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
            return self._read(self.path) or {"pid": "?", "host": "?"}
        finally:
            tmp.unlink(missing_ok=True)

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        announced = False
        while True:
            holder = self._holder()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                since = time.strftime("%H:%M:%S", time.localtime(float(holder.get("started", 0))))
                raise CptkitError(f"{self.out}: another cptkit run is writing this output (pid {holder.get('pid')} "
                                  f"on {holder.get('host')}, since {since}); wait for it to end, or pass "
                                  "io.lock_wait_s=SECONDS to wait")
            if not announced:
                log.warning("%s: waiting for pid %s on %s to release the output", self.out, holder.get("pid"),
                            holder.get("host"))
                announced = True
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))

    def holders(self) -> set[int]:
        """The pids of the processes holding a lock of this output (on any host): its live writers."""
        pids = set()
        for p in self.dir.glob("lock-*"):
            info = self._read(p)
            if info is not None and str(info.get("pid", "")).isdigit():
                pids.add(int(info["pid"]))
        return pids

    def release(self) -> None:
        if self.held:
            info = self._read(self.path)
            if info is not None and info.get("pid") == os.getpid() and info.get("host") == self.host:
                self.path.unlink(missing_ok=True)
            self.held = False


_LAST: list[Job] = []  # the job this process entered last (for the Ctrl-C message)
_SIGNALLED: list[int] = []  # SIGTERM, once it stopped this process's job
_TERM_OWNER: list[int] = [0]  # the process whose job installed _on_sigterm


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run: unwound as Ctrl-C is (temporary files removed, finished tasks kept);
    the CLI reports it in one line and exits 143 (:func:`interrupted_exit_code`)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _TERM_OWNER[0]:  # a forked worker (it inherited the handler): die as SIGTERM does
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _SIGNALLED[:] = [signum]
    raise Terminated


_FORK_MASK: list[set] = []  # the signal mask of the thread forking, while SIGTERM is held across a fork


def _before_fork() -> None:
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        _FORK_MASK[:] = [signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})]


def _after_fork_in_parent() -> None:
    if _FORK_MASK:
        signal.pthread_sigmask(signal.SIG_SETMASK, _FORK_MASK.pop())


def _after_fork_in_child() -> None:
    if _FORK_MASK:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, _FORK_MASK.pop())


# A worker forked during a run (dedup.workers) starts with SIGTERM's default action: Pool.terminate
# kills it at once, even a moment after its fork (a Python handler could lose that signal there).
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def interrupted_exit_code() -> int:
    """The CLI's exit status for an interrupted run: 143 (128 + SIGTERM) or 130 (Ctrl-C)."""
    return 128 + _SIGNALLED[0] if _SIGNALLED else 130


def interrupted_message() -> str:
    """What a SIGINT or SIGTERM left on disk and how to resume (for the CLI's exit 130 or 143)."""
    what = "terminated (SIGTERM)" if _SIGNALLED else "interrupted"
    job = _LAST[0] if _LAST else None
    if job is None or job.stdout:
        return what
    if not (job.out / STATE_DIR / "done").is_dir():
        return f"{what}: nothing was kept in {job.out}"
    done = len(list((job.out / STATE_DIR / "done").glob("*.json")))
    return (f"{what}: {done} of {len(job.tasks)} tasks of {job.out} are finished and kept; "
            "rerun the same command to resume")


class Job:
    """Context manager around a step run. Use :meth:`pending` / :meth:`read` / :meth:`writer`.

    ``independent_tasks=False`` says the tasks share state (a global phase, caches): then any
    changed input redoes the whole unfinished output instead of the tasks that read it.
    ``reads``: the other files and directories the run reads (models, tokenizers); a path that
    does not exist (a model name, not a file) is skipped. They key the output as the inputs do:
    one replaced in place redoes an unfinished output and makes a finished one refuse."""

    def __init__(self, ctx: Run, *, inputs: list[InputFile] | None = None, tasks: list[Task] | None = None,
                 needs_inputs: bool = True, independent_tasks: bool = True, hooks: Hooks | None = None,
                 reads: list[Any] | None = None):
        self.hooks = hooks or Hooks()
        self.ctx = ctx
        self.step = ctx.step
        self.quiet = ctx.quiet
        setup_logging(self.quiet)
        self.config = ctx.record  # what the manifest and results record: never a secret
        out = ctx.io.output
        if inputs is None and needs_inputs:
            inputs = ctx.resolve_inputs()
            if out is not None and str(out) != STDIO:  # --out inside an --in directory: never read our own shards
                own = os.path.realpath(str(out)) + os.sep
                inputs = [f for f in inputs if f.path == STDIO or not (f.real or os.path.realpath(f.path)).startswith(own)]
                if not inputs:
                    raise CptkitError(f"--in {' '.join(map(str, ctx.io.inputs))}: holds no data files outside --out {out}")
        self.inputs = inputs or []
        self._default_tasks = tasks is None  # the inputs in groups (their layout is kept: tasks.json)
        self._layout_kept = False  # the groups are those of tasks.json
        self.tasks = tasks if tasks is not None else self._grouped()
        if any(f.path == STDIO for f in self.inputs) and len(self.tasks) > 1:
            raise CptkitError("stdin (-) cannot be combined with other inputs")
        if out is None:
            raise CptkitError("no output given: pass --out PATH (a directory, or - for stdout)")
        self.stdout = str(out) == STDIO
        self.out = Path(str(out))
        self.shard_index, self.shard_count = ctx.shard.index, ctx.shard.count
        self.independent = independent_tasks
        self.hash = config_hash(self.config)
        self.created = False  # this run made OUT (or found it empty): bad input empties it again
        self._made_dir = False
        self.already_done = False
        self.lock: OutputLock | None = None
        self.t0 = time.time()
        self.results: dict[str, TaskResult] = {}
        self.progress = make_progress(self.quiet)
        self._bar: Any = None
        self._ids: set[int] = set()
        self._read_tasks: set[tuple[str, ...]] = set()
        self.reads = [str(p) for p in (reads or []) if p is not None and str(p) and os.path.exists(str(p))]
        self._fp_of: dict[str, dict] = {}  # each input's fingerprint as this run found it, by its path
        self._fps = self._fingerprints()
        self._prev_term: Any = None
        hash_cache().save()

    def _grouped(self) -> list[Task]:
        """The default tasks: the inputs, in order, in groups of up to ``shard.task_bytes`` bytes."""
        groups = group_inputs(self.inputs, int(self.ctx.shard.task_bytes))
        return [Task(i, g) for i, g in enumerate(groups)]

    def _fp(self, inp: InputFile) -> dict:
        """:func:`fingerprint` of an input, taken once per run (markers record what the run started from)."""
        if inp.path not in self._fp_of:
            self._fp_of[inp.path] = fingerprint(inp)
        return self._fp_of[inp.path]

    def _fingerprints(self) -> list[dict]:
        seen: dict[str, dict] = {}
        for f in [*self.inputs, *(f for t in self.tasks for f in t.inputs)]:
            fp = self._fp(f)
            seen.setdefault(fp["path"], fp)
        for path in self.reads:
            fp = fingerprint_path(path)
            seen.setdefault(fp["path"], fp)
        return list(seen.values())

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Job:
        _LAST[:] = [self]
        _SIGNALLED.clear()
        OWNER_PID.append(os.getpid())
        self._catch_sigterm()
        try:
            if not self.stdout:
                self._prepare_output()
            self.progress.start()
        except BaseException:
            self._release()
            self._leave()
            raise
        return self

    def _catch_sigterm(self) -> None:
        """SIGTERM raises :class:`Terminated` in this process while the job runs (unless the program
        handles SIGTERM itself, or this is not the main thread)."""
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            _TERM_OWNER[0] = os.getpid()
            self._prev_term = signal.signal(signal.SIGTERM, _on_sigterm)

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _leave(self) -> None:
        """Undo what entering did to the process: the SIGTERM handler, the temporary files' pid."""
        if self._prev_term is not None:
            signal.signal(signal.SIGTERM, self._prev_term)
            self._prev_term = None
        if OWNER_PID:
            OWNER_PID.pop()

    def _remove_dead_tmps(self, gone: int | None = None) -> None:
        """Remove the temporary files (``.NAME.tmp-PID``) in OUT and OUT/.cptkit of writers that are
        gone: PID holds no lock of this output (every live writer does, and its forked workers name
        it); ``gone``: a pid to count as gone too (this process, failing)."""
        def live() -> set[int]:
            return (self.lock.holders() if self.lock is not None else set()) - {gone}

        remove_dead_tmps(self.out, ".*.tmp-*", live=live)
        remove_dead_tmps(self.out / STATE_DIR, "**/.*.tmp-*", live=live)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.progress.stop()
        try:
            if exc_type is None or self.stdout:
                return
            self._remove_dead_tmps(gone=os.getpid())
            if issubclass(exc_type, CptkitError) and self.created and self.shard_count == 1:
                self._release()
                if self._made_dir:
                    shutil.rmtree(self.out, ignore_errors=True)
                else:  # it was empty: leave it empty
                    self._clear()
                    shutil.rmtree(self.out / STATE_DIR, ignore_errors=True)
        finally:
            self._release()
            self._leave()

    def _clear(self) -> None:
        """Empty OUT, keeping the directory and the live locks in ``.cptkit``; the default tasks
        are grouped anew."""
        if self._default_tasks:
            self.tasks, self._layout_kept = self._grouped(), False
        if not self.out.is_dir():
            return
        for p in self.out.iterdir():
            if p.name == STATE_DIR:
                for q in p.iterdir():
                    if not q.name.startswith("lock-"):
                        shutil.rmtree(q) if q.is_dir() and not q.is_symlink() else q.unlink(missing_ok=True)
            elif p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)

    def _prepare_output(self) -> None:
        out, state = self.out, self.out / STATE_DIR
        overwrite = self.ctx.io.overwrite
        if out.exists() and not out.is_dir():
            raise CptkitError(f"--out {out}: is an existing file, not a directory; pass a directory (or - for stdout)")
        try:
            out.mkdir(parents=True)
            self.created = self._made_dir = True
        except FileExistsError:
            if not state.exists() and not (out / SUCCESS).exists():
                if any(out.iterdir()):
                    raise CptkitError(f"{out}: exists and is not a cptkit output; refusing to write into it "
                                      "(pass another --out)") from None
                self.created = True  # an empty directory: ours to fill
        _real_dir(state)
        self.lock = OutputLock(out, self.shard_index, self.shard_count, self.ctx.io.lock_wait_s)
        self.lock.acquire()
        self._remove_dead_tmps()
        if overwrite and self.shard_count > 1 and not self.created:
            raise CptkitError("io.overwrite=true with shard.count > 1 would delete the other slices' work: "
                              f"delete {out} once before starting the array")
        if overwrite and not self.created:
            log.info("%s: io.overwrite=true: starting over", out)
            self._clear()
        self._check_identity(state)
        _real_dir(state / "done")

    def _check_identity(self, state: Path) -> None:
        """Compare the config and the inputs with those of the output's earlier run (if any)."""
        out = self.out
        hash_file, inputs_file = state / "config_hash", state / INPUTS
        old_hash = hash_file.read_text() if hash_file.exists() else None
        try:
            old_fps = json.loads(inputs_file.read_text()) if inputs_file.exists() else None
        except ValueError:  # unreadable run state: nothing to compare with, the markers still are
            old_fps = None
        finished = is_finished(out)
        if finished and old_hash is None and (out / MANIFEST).exists():
            old_hash = json.loads((out / MANIFEST).read_text()).get("config_hash")
        if old_hash is not None and old_hash != self.hash:
            what = "a finished output" if finished else "an unfinished run"
            raise CptkitError(f"{out}: holds {what} of another config; pass io.overwrite=true to start over, "
                              "or choose another --out")
        if old_fps is not None:
            set_diff, changed = input_changes(old_fps, self._fps)
            old_by = {f["path"]: f for f in old_fps}
            if set_diff:
                what = "a finished output" if finished else "an unfinished run"
                raise CptkitError(f"{out}: holds {what} of another input set ({set_diff[0]}); "
                                  "pass io.overwrite=true to start over, or choose another --out")
            self._adopt_layout(state)
            if changed:
                why = _describe_change(changed[0], old_by.get(changed[0]), {f["path"]: f for f in self._fps}[changed[0]])
                if finished:
                    raise CptkitError(f"{out}: is a finished output of inputs that changed since ({why}); "
                                      "pass io.overwrite=true to redo it, or choose another --out")
                self._redo(changed, why)
        if finished:
            log.info("%s: already complete (same config and inputs): nothing to do", out)
            self.already_done = True
            return
        if not hash_file.exists():  # never rewritten in place: array members read it concurrently
            atomic_write_bytes(hash_file, self.hash.encode())
        if old_fps != self._fps or not inputs_file.exists():
            atomic_write_json(inputs_file, self._fps, indent=None)
        if self._default_tasks and not self._layout_kept:
            atomic_write_json(state / TASKS, [[self._fp(f)["path"] for f in t.inputs] for t in self.tasks], indent=None)

    def _adopt_layout(self, state: Path) -> None:
        """Default tasks keep the groups of the output's first run (``.cptkit/tasks.json``, written
        once), so that an input that changed size since redoes its own group, not the groups after it."""
        if not self._default_tasks:
            return
        try:
            groups = json.loads((state / TASKS).read_text())
        except (OSError, ValueError):
            return
        by_path = {self._fp(f)["path"]: f for f in self.inputs}
        if (isinstance(groups, list) and all(isinstance(g, list) and g for g in groups)
                and sorted(p for g in groups for p in g) == sorted(by_path)):
            self.tasks = [Task(i, [by_path[p] for p in g]) for i, g in enumerate(groups)]
            self._layout_kept = True

    def _redo(self, changed: list[str], why: str) -> None:
        """Inputs of an unfinished run changed: redo the tasks that read them (or everything)."""
        changed_set = set(changed)
        hit = [t for t in self.tasks if any(self._fp(f)["path"] in changed_set for f in t.inputs)]
        in_tasks = {self._fp(f)["path"] for t in self.tasks for f in t.inputs}
        if not self.independent or not changed_set <= in_tasks:
            log.warning("%s; redoing the whole unfinished output", why)
            self._clear()
            return
        log.warning("%s; redoing the %d task(s) that read it", why, len(hit))
        for t in hit:
            self.marker(t).unlink(missing_ok=True)
            for stale in self.out.glob(f"*-{t.name}-*"):
                if stale.is_file() and not stale.name.startswith(("_", ".")):
                    stale.unlink()

    # -- tasks -----------------------------------------------------------------------------
    def mine(self) -> list[Task]:
        """The tasks of this process's slice (``shard.index`` of ``shard.count``)."""
        return [t for t in self.tasks if t.index % self.shard_count == self.shard_index]

    def marker(self, task: Task) -> Path:
        return self.out / STATE_DIR / "done" / f"{task.name}.json"

    def is_done(self, task: Task) -> bool:
        if self.stdout or not self.marker(task).exists():
            return False
        try:
            read = json.loads(self.marker(task).read_text()).get("read")
        except ValueError:
            return False
        if read is None:
            return True
        now = [self._fp(f) for f in task.inputs]
        return len(read) == len(now) and all(o.get("path") == n["path"] and same_read(o, n)
                                              for o, n in zip(read, now, strict=True))

    def pending(self) -> list[Task]:
        """Tasks of this slice that still need work; finished ones are reported and skipped."""
        if self.already_done:
            return []
        mine = self.mine()
        todo = [t for t in mine if not self.is_done(t)]
        if len(todo) < len(mine):
            log.info("resuming: %d of %d tasks already done", len(mine) - len(todo), len(mine))
        total = sum(f.size for t in todo for f in t.inputs)
        self._bar = self.progress.add_task(self.step, total=total or None)
        return todo

    def read(self, task: Task, stats: ReadStats | None = None, plain_ids: bool = False) -> Iterator[Record]:
        """Read a task's input records, advancing the progress bar and the task's counters.

        With ``io.unique_ids`` (default) an id read twice in this run is an error naming its
        file and line (a task read again is not checked twice); so is, with ``plain_ids``, an id
        holding whitespace or a control character (a step writing ids into a tabular file)."""
        res = self.results.setdefault(task.name, TaskResult())
        io_cfg = self.ctx.io
        skip = io_cfg.skip_bad_lines
        key = (task.name, *(f.path for f in task.inputs))
        check_ids = io_cfg.unique_ids and key not in self._read_tasks
        self._read_tasks.add(key)
        ids = self._ids
        for inp in task.inputs:
            st = stats or ReadStats()
            seen = 0
            for rec in read_records(inp, skip_bad=skip, stats=st, plain_ids=plain_ids, **io_cfg.limits()):
                if check_ids:
                    h = hash(rec["id"])
                    if h in ids:
                        raise BadInput(inp.name, st.line, f"duplicate id {rec['id']!r} (read earlier in this run); "
                                       "ids must be unique (io.unique_ids=false turns this check off)")
                    ids.add(h)
                res.records_in += 1
                yield rec
                if res.records_in % 256 == 0 and self._bar is not None:
                    self.progress.update(self._bar, advance=st.bytes - seen)
                    seen = st.bytes
            res.bad += st.bad
            if self._bar is not None:
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

    def complete(self, task: Task, writer: ShardWriter | None = None, **extra: Any) -> None:
        """Mark ``task`` done (after its writer is closed), recording what it read."""
        res = self.results.setdefault(task.name, TaskResult())
        if writer is not None:
            res.records_out += writer.records
            res.files += writer.files
        res.extra.update(extra)
        if not self.stdout:
            atomic_write_json(self.marker(task), {"task": task.name, "inputs": [f.path for f in task.inputs],
                                                  "read": [self._fp(f) for f in task.inputs],
                                                  "config_hash": self.hash, **res.__dict__}, indent=None)
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
        if self.stdout:
            return {k: v.__dict__ for k, v in self.results.items()}
        done = {}
        for p in sorted((self.out / STATE_DIR / "done").glob("*.json")):
            done[p.stem] = json.loads(p.read_text())
        return done

    def finish(self, extra: dict[str, Any] | None = None, title: str | None = None) -> dict[str, Any]:
        """Write the manifest, the data card and ``_SUCCESS`` when every task is done; print the summary."""
        self.progress.stop()
        seconds = time.time() - self.t0
        if self.already_done:
            manifest = json.loads((self.out / MANIFEST).read_text())
            return manifest["counts"] | {"seconds": seconds, "skipped": True}
        extra = redact(extra or {})
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
            **extra,
            "seconds": seconds,
            "records/s": (here_in or sum(r.records_out for r in mine.values())) / seconds if seconds > 0 else 0.0,
        }
        complete = self.stdout or all(t.name in results for t in self.tasks)
        if complete and not self.stdout:
            if self.hooks.before_complete is not None:
                self.hooks.before_complete(self)
            files = sorted(f for r in results.values() for f in r["files"])
            manifest = {
                "step": self.step,
                "version": __version__,
                "config": self.config,
                "config_hash": self.hash,
                "inputs": [{"path": f.path, "size": f.size} for f in self.inputs],
                "counts": counts,
                "files": files,
                "extra": extra,
                "timings": {"started": self.t0, "finished": time.time(), "seconds_last_run": seconds,
                            "seconds_tasks": {k: r.get("extra", {}).get("seconds") for k, r in results.items()}},
            }
            if self.hooks.manifest_extra is not None:
                manifest |= self.hooks.manifest_extra()
            atomic_write_json(self.out / MANIFEST, manifest)
            write_card(self.out, self.step, files)
            atomic_write_bytes(self.out / SUCCESS, b"")  # last; never through a link planted there
        elif not self.stdout:
            log.info("slice %d/%d done; %d of %d tasks finished overall", self.shard_index, self.shard_count,
                     len(results), len(self.tasks))
        print_summary(title or f"cptkit {self.step}", rows, self.quiet)
        return counts | {"seconds": seconds, "extra": extra, "output": str(self.out)}


def is_finished(out: Path) -> bool:
    """Whether ``out`` is a finished output: its ``_SUCCESS`` is a file (a link is never one cptkit wrote)."""
    return (out / SUCCESS).is_file() and not (out / SUCCESS).is_symlink()


def _real_dir(path: Path) -> None:
    """Make the directory ``path`` (run state) unless it exists; a link there is refused, never written through."""
    if path.is_symlink():
        raise CptkitError(f"{path}: is a symbolic link; cptkit writes its run state only into a real directory "
                          "(remove the link, or choose another --out)")
    path.mkdir(exist_ok=True)


def write_card(out: Path, step: str, files: list[str]) -> None:
    """``OUT/README.md``: a data card whose ``configs: data_files`` makes
    ``datasets.load_dataset(OUT)`` load the data shards (and nothing else) as the train split."""
    suffixes = sorted({f[f.index("."):] for f in files if f.startswith("part-") and "." in f})
    if not suffixes:
        return
    patterns = "".join(f"          - \"part-*{s}\"\n" for s in suffixes)
    card = ("---\nconfigs:\n  - config_name: default\n    data_files:\n      - split: train\n        path:\n"
            f"{patterns}---\n\n# cptkit {step} output\n\nJSON Lines records (`id`, `text`, ...) in `part-*` shards; "
            "`_manifest.json` holds the config, inputs and counts (docs/records.md).\n\n"
            "```python\nimport datasets\nds = datasets.load_dataset(\"path/to/this/dir\", split=\"train\")\n```\n")
    atomic_write_bytes(out / CARD, card.encode())
