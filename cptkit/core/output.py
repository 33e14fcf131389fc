"""A step's output directory: its lock, its identity, task markers, manifest, data card and ``_SUCCESS``.

The output protocol (docs/records.md):

* ``OUT/part-TTTTT-KKKK.jsonl.gz``: data shards; task ``T`` writes shards ``K = 0, 1, ...``.
* ``OUT/.cptkit/done/TTTTT.json``: a task's completion marker (counts, files, seconds, and what the
  task read: each input's path, size, mtime_ns and sha256); ``OUT/.cptkit/tasks.json`` keeps the
  task groups of the output's first run.
* ``OUT/.cptkit/inputs.json``: every input of the run and every other file it reads (models,
  tokenizers), each with path, size, mtime_ns and sha256; ``OUT/.cptkit/config_hash``.
* ``OUT/.cptkit/lock-IIIII-of-NNNNN``: the lock of the run writing slice ``I`` (pid, host).
* ``OUT/_manifest.json``, ``OUT/README.md`` (a data card) and ``OUT/_SUCCESS``: written once
  every task is done (:meth:`OutputDir.finish`).
* Other ``OUT/_*`` files are a step's side outputs (removed ids, run files, indexes).

:meth:`OutputDir.open` takes the lock and compares the run's identity (its config hash and the
fingerprints of what it reads, :mod:`cptkit.core.fingerprint`) with the earlier run's: the same
→ resume; another config or input set → refuse, naming what changed; a changed input of an
unfinished output → the caller redoes what read it (:class:`Earlier`). If a run fails on bad
input and created ``OUT`` (or found it empty), :meth:`OutputDir.close` empties it again.

Nothing is written through a link: every file is written under a new temporary name
(``O_EXCL|O_NOFOLLOW``) and renamed over its final name; opening an output removes the
temporary files of writers that are gone.

An object-store ``--out`` (``s3://...``, :mod:`cptkit.core.remote`) is written the same way into a
local staging directory, which the store mirrors: the lock is a conditional put, the run state is
pulled at :meth:`OutputDir.open`, each task's shards and then its marker are uploaded when it
completes, and :meth:`OutputDir.finish` uploads ``_SUCCESS`` last (docs/records.md).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit import __version__
from cptkit.core import remote
from cptkit.core.errors import PLACE_ERRNOS, CptkitError
from cptkit.core.fingerprint import (
    describe_change,
    fingerprint,
    input_changes,
    remove_dead_tmps,
    same_read,
)
from cptkit.core.progress import log
from cptkit.core.shards import (
    STDIO,
    InputFile,
    atomic_write_bytes,
    atomic_write_json,
    open_new,
    pid_alive,
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
    """What a task did, as its marker records it."""

    records_in: int = 0
    records_out: int = 0
    bad: int = 0
    files: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, other: TaskResult) -> None:
        """Count ``other`` in too (its extra entries replace this one's)."""
        self.records_in += other.records_in
        self.records_out += other.records_out
        self.bad += other.bad
        self.files += other.files
        self.extra.update(other.extra)


@dataclass
class Earlier:
    """What :meth:`OutputDir.open` found of an earlier run of the same identity."""

    changed: list[str] = field(default_factory=list)  # paths of inputs whose contents changed (unfinished output)
    why: str = ""  # how the first of them changed
    layout: list[list[str]] | None = None  # the input paths of each task of the output's first run


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
        return info.get("host") == self.host and (info.get("pid") == os.getpid() or not pid_alive(int(info.get("pid", 0))))

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


class OutputDir:
    """The output of one run (``-``: stdout, which keeps no state). ``identity``: the config hash
    that names what the output holds (:func:`cptkit.core.fingerprint.config_hash` of the recorded
    config, or a step's own, e.g. a training run's without ``train.max_steps``).

    Verbs: :meth:`open` (lock, compare identities), :meth:`reopen` (extend a finished output),
    :meth:`is_complete` / :meth:`complete` (task markers), :meth:`results`, :meth:`finish`
    (manifest, data card, ``_SUCCESS``) and :meth:`close`."""

    def __init__(self, path: Any, *, step: str, config: dict, identity: str, index: int = 0, count: int = 1,
                 overwrite: bool = False, lock_wait_s: float = 0.0):
        if path is None:
            raise CptkitError("no output given: pass --out PATH (a directory, or - for stdout)")
        self.stdout = str(path) == STDIO
        self.step, self.config, self.identity = step, config, identity
        self.index, self.count = index, count
        if not 0 <= index < count:
            raise CptkitError(f"shard.index={index} must be in [0, shard.count={count})")
        path = remote.local_path(str(path))
        # an object store: written into a local staging directory that the store mirrors
        self.remote = remote.RemoteOutput(path) if remote.is_url(path) else None
        self.path = remote.staging_dir(path, index, count) if self.remote is not None else Path(path)
        self.name = self.remote.url if self.remote is not None else str(self.path)  # in messages
        self.overwrite, self.lock_wait_s = overwrite, lock_wait_s
        self.created = False  # this run made OUT (or found it empty): bad input empties it again
        self._made_dir = False
        self.finished = False  # a finished output of the same identity: nothing to do (see reopen)
        self.lock: OutputLock | None = None
        self._fp_of: dict[str, dict] = {}  # each input's fingerprint as this run found it, by its path

    @property
    def is_finished(self) -> bool:
        """Whether :meth:`open` found the output finished (same identity and inputs): nothing to do."""
        return self.finished

    def fp(self, inp: InputFile) -> dict:
        """:func:`fingerprint` of an input, taken once per run (markers record what the run started from)."""
        if inp.path not in self._fp_of:
            self._fp_of[inp.path] = fingerprint(inp)
        return self._fp_of[inp.path]

    def state(self) -> Path:
        return self.path / STATE_DIR

    # -- a step's own files ----------------------------------------------------------------
    def file(self, name: str) -> Path:
        """The path of a step's side file ``OUT/name`` (``_removed.jsonl``, ``results.json``, a folder
        a library writes into): inside OUT, so an object store mirrors it, and never a file the output
        protocol owns (``_SUCCESS``, ``_manifest.json``, the state directory)."""
        return self.path / _inside(name, owned=(SUCCESS, MANIFEST, STATE_DIR))

    def state_path(self, name: str) -> Path:
        """The path of a step's run state ``OUT/.cptkit/name`` (caches a rerun reuses; never a lock
        or a task marker)."""
        return self.state() / _inside(name, owned=("done", TASKS, INPUTS, "config_hash"), lock=True)

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write the side file ``OUT/name`` atomically (:meth:`file`); returns its path."""
        path = self.file(name)
        atomic_write_bytes(path, data)
        return path

    def write_json(self, name: str, obj: Any, indent: int | None = 2) -> Path:
        """Write the side file ``OUT/name`` as JSON atomically (secrets masked); returns its path."""
        path = self.file(name)
        atomic_write_json(path, obj, indent=indent)
        return path

    def unfinish(self) -> None:
        """Remove ``_SUCCESS``: a finished output being extended is unfinished until :meth:`finish`."""
        (self.path / SUCCESS).unlink(missing_ok=True)

    # -- opening ---------------------------------------------------------------------------
    def open(self, fingerprints: list[dict]) -> Earlier:
        """Make or check OUT, take this slice's lock, remove dead writers' temporary files, start
        over with ``io.overwrite``, and compare ``fingerprints`` and the identity with the earlier
        run's (refusing another config or input set, or a finished output whose inputs changed)."""
        out = self.path
        if self.remote is not None:
            self._open_remote()
        if out.exists() and not out.is_dir():
            raise CptkitError(f"--out {out}: is an existing file, not a directory; pass a directory (or - for stdout)")
        try:
            self._make()
            self.lock = OutputLock(out, self.index, self.count, self.lock_wait_s)
            self.lock.acquire()
        except OSError as e:  # a read-only file system, a file on the way to OUT, no permission
            if e.errno not in PLACE_ERRNOS:  # a resource that ran out: cptkit.core.discovery.execute names it
                raise
            raise unwritable(out, e) from None
        self.remove_dead_tmps()
        if self.overwrite and self.count > 1 and not self.created:
            raise CptkitError("io.overwrite=true with shard.count > 1 would delete the other slices' work: "
                              f"delete {self.name} once before starting the array")
        if self.overwrite and not self.created:
            log.info("%s: io.overwrite=true: starting over", out)
            self.clear()
        return self._compare(fingerprints)

    def _make(self) -> None:
        """Make OUT and its state directory, or check that an existing OUT is ours to write."""
        out, state = self.path, self.state()
        try:
            out.mkdir(parents=True)
            self.created = self._made_dir = True
        except FileExistsError:
            if not state.exists() and not (out / SUCCESS).exists():
                entries = any(out.iterdir())
                # another slice of this run may have made OUT a moment ago: its state directory is the
                # first thing it writes there, so it is looked for again after the listing
                if entries and not state.exists():
                    raise CptkitError(f"{self.name}: exists and is not a cptkit output; refusing to write into it "
                                      "(pass another --out)") from None
                self.created = not entries  # an empty directory: ours to fill
        _real_dir(state)

    def _open_remote(self) -> None:
        """Take the store's lock (a conditional put), then start the staging directory anew with the
        output's run state pulled from the store; a prefix holding other objects is refused."""
        assert self.remote is not None
        self.remote.acquire(self.index, self.count, self.lock_wait_s)
        remote.fresh_dir(self.path)
        found = [r for r in self.remote.pull(self.path) if not r.startswith(".cptkit/lock-")]
        if found and not any(r.startswith(".cptkit/") or r == SUCCESS for r in found):
            raise CptkitError(f"{self.name}: holds objects and is not a cptkit output; refusing to write into it "
                              "(pass another --out)")

    def _old_identity(self) -> tuple[str | None, list[dict] | None]:
        state = self.state()
        hash_file, inputs_file = state / "config_hash", state / INPUTS
        old_hash = hash_file.read_text() if hash_file.exists() else None
        try:
            old_fps = json.loads(inputs_file.read_text()) if inputs_file.exists() else None
        except ValueError:  # unreadable run state: nothing to compare with, the markers still are
            old_fps = None
        if self.finished and old_hash is None and (self.path / MANIFEST).exists():
            old_hash = json.loads((self.path / MANIFEST).read_text()).get("config_hash")
        return old_hash, old_fps

    def _compare(self, fps: list[dict]) -> Earlier:
        """Compare the config and the inputs with those of the output's earlier run (if any)."""
        out = self.path
        self.finished = is_finished(out)
        old_hash, old_fps = self._old_identity()
        what = "a finished output" if self.finished else "an unfinished run"
        if old_hash is not None and old_hash != self.identity:
            raise CptkitError(f"{self.name}: holds {what} of another config; pass io.overwrite=true to start over, "
                              "or choose another --out")
        self._fps, self._old_fps = fps, old_fps
        earlier = Earlier()
        if old_fps is None:
            return earlier
        set_diff, changed = input_changes(old_fps, fps)
        if set_diff:
            raise CptkitError(f"{self.name}: holds {what} of another input set ({set_diff[0]}); "
                              "pass io.overwrite=true to start over, or choose another --out")
        earlier.layout = self._layout()
        if changed:
            old_by = {f["path"]: f for f in old_fps}
            earlier.changed = changed
            earlier.why = describe_change(changed[0], old_by.get(changed[0]), {f["path"]: f for f in fps}[changed[0]])
            if self.finished:
                raise CptkitError(f"{self.name}: is a finished output of inputs that changed since ({earlier.why}); "
                                  "pass io.overwrite=true to redo it, or choose another --out")
        return earlier

    def _layout(self) -> list[list[str]] | None:
        try:
            groups = json.loads((self.state() / TASKS).read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(groups, list) and all(isinstance(g, list) and g for g in groups)
        return groups if ok else None

    def start(self, layout: list[list[str]] | None = None) -> None:
        """Record the run's identity (once: array members read it concurrently), its fingerprints
        and, given, its task ``layout`` (``tasks.json``); a finished output is left as it is."""
        state = self.state()
        if self.finished:
            log.info("%s: already complete (same config and inputs): nothing to do", self.path)
        else:
            hash_file, inputs_file = state / "config_hash", state / INPUTS
            if not hash_file.exists():  # never rewritten in place: array members read it concurrently
                atomic_write_bytes(hash_file, self.identity.encode())
            if self._old_fps != self._fps or not inputs_file.exists():
                atomic_write_json(inputs_file, self._fps, indent=None)
            if layout is not None:
                atomic_write_json(state / TASKS, layout, indent=None)
        _real_dir(state / "done")
        self.push()

    def reopen(self) -> None:
        """A finished output is to be extended (a training run given more steps): its work runs
        again and :meth:`finish` writes it anew (the step removes ``_SUCCESS`` once it may)."""
        self.finished = False

    # -- clearing and closing --------------------------------------------------------------
    def remove_dead_tmps(self, gone: int | None = None) -> None:
        """Remove the temporary files (``.NAME.tmp-PID``) in OUT and OUT/.cptkit of writers that are
        gone: PID holds no lock of this output (every live writer does, and its forked workers name
        it); ``gone``: a pid to count as gone too (this process, failing)."""
        def live() -> set[int]:
            return (self.lock.holders() if self.lock is not None else set()) - {gone}

        remove_dead_tmps(self.path, ".*.tmp-*", live=live)
        remove_dead_tmps(self.state(), "**/.*.tmp-*", live=live)

    def push(self, final: bool = False) -> None:
        """Upload what changed in the staging directory to the store (nothing for a local output)."""
        if self.remote is not None and not self.stdout:
            self.remote.push(self.path, final=final)

    def clear(self) -> None:
        """Empty OUT, keeping the directory and the live locks in ``.cptkit``."""
        if self.remote is not None:
            self.remote.remove([r for r in self.remote.listing() if not r.startswith(".cptkit/lock-")])
        if not self.path.is_dir():
            return
        for p in self.path.iterdir():
            if p.name == STATE_DIR:
                for q in p.iterdir():
                    if not q.name.startswith("lock-"):
                        shutil.rmtree(q) if q.is_dir() and not q.is_symlink() else q.unlink(missing_ok=True)
            elif p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)

    def forget(self, task: Task) -> None:
        """Drop a task's marker and shards: it runs again."""
        self.marker(task).unlink(missing_ok=True)
        for stale in self.path.glob(f"*-{task.name}-*"):
            if stale.is_file() and not stale.name.startswith(("_", ".")):
                stale.unlink()
        if self.remote is not None:
            mark = self.marker(task).relative_to(self.path).as_posix()
            self.remote.remove([r for r in self.remote.listing() if r == mark or (
                "/" not in r and f"-{task.name}-" in r and not r.startswith(("_", ".")))])

    def close(self, exc_type: type[BaseException] | None) -> None:
        """Release the lock; a run that failed leaves no temporary files, and one that failed on bad
        input (a :class:`CptkitError`) in an output it created leaves it as it found it."""
        try:
            if self.stdout:
                return
            if exc_type is None:
                self.push()
                return
            self.remove_dead_tmps(gone=os.getpid())
            if issubclass(exc_type, CptkitError) and self.created and self.count == 1:
                if self.remote is not None:  # what this run uploaded goes, then its lock
                    self.clear()
                self.release()
                if self._made_dir:
                    shutil.rmtree(self.path, ignore_errors=True)
                else:  # it was empty: leave it empty
                    self.clear()
                    shutil.rmtree(self.state(), ignore_errors=True)
            elif self.remote is not None:
                try:  # what the run finished (whole shards, their markers) is kept for the rerun
                    self.push()
                except CptkitError as e:
                    log.warning("%s", e)
        finally:
            self.release()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if self.remote is not None:  # the store holds the state: the staging directory goes with the lock
            self.remote.release()
            if not self.stdout:
                shutil.rmtree(self.path, ignore_errors=True)

    # -- task markers ----------------------------------------------------------------------
    def marker(self, task: Task) -> Path:
        return self.state() / "done" / f"{task.name}.json"

    def is_complete(self, task: Task) -> bool:
        """Whether ``task`` has a marker of a run that read what this run reads."""
        if self.stdout:
            return False
        if not self.marker(task).exists() and self.remote is not None:  # another slice's, since open
            self.remote.fetch(self.marker(task).relative_to(self.path).as_posix(), self.marker(task), atomic_write_bytes)
        if not self.marker(task).exists():
            return False
        try:
            read = json.loads(self.marker(task).read_text()).get("read")
        except ValueError:
            return False
        if read is None:
            return True
        now = [self.fp(f) for f in task.inputs]
        return len(read) == len(now) and all(o.get("path") == n["path"] and same_read(o, n)
                                              for o, n in zip(read, now, strict=True))

    def complete(self, task: Task, result: TaskResult) -> None:
        """Write ``task``'s marker: ``result`` and what the task read (nothing to stdout)."""
        if self.stdout:
            return
        atomic_write_json(self.marker(task), {"task": task.name, "inputs": [f.path for f in task.inputs],
                                              "read": [self.fp(f) for f in task.inputs],
                                              "config_hash": self.identity, **result.__dict__}, indent=None)
        self.push()  # the task's shards, then its marker

    def results(self) -> dict[str, dict]:
        """Every task marker of the output (this run's, earlier runs' and other slices'), by task name."""
        done = {}
        if self.remote is not None:  # other slices' markers, from other machines
            self.remote.pull(self.path, ".cptkit/done/")
        for p in sorted((self.state() / "done").glob("*.json")):
            done[p.stem] = json.loads(p.read_text())
        return done

    def done_count(self) -> int | None:
        """How many task markers the output holds (None: it keeps none)."""
        if self.stdout or not (self.state() / "done").is_dir():
            return None
        if self.remote is not None:
            self.remote.pull(self.path, ".cptkit/done/")
        return len(list((self.state() / "done").glob("*.json")))

    # -- the end ---------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """The finished output's ``_manifest.json``."""
        return json.loads((self.path / MANIFEST).read_text())

    def finish(self, inputs: list[InputFile], results: dict[str, dict], counts: dict[str, int], extra: dict,
               started: float, seconds: float, manifest_extra: Callable[[], dict[str, Any]] | None = None) -> None:
        """Write ``_manifest.json``, the data card and, last of all, ``_SUCCESS``."""
        files = sorted(f for r in results.values() for f in r["files"])
        manifest = {
            "step": self.step,
            "version": __version__,
            "config": self.config,
            "config_hash": self.identity,
            "inputs": [{"path": f.path, "size": f.size} for f in inputs],
            "counts": counts,
            "files": files,
            "extra": extra,
            "timings": {"started": started, "finished": time.time(), "seconds_last_run": seconds,
                        "seconds_tasks": {k: r.get("extra", {}).get("seconds") for k, r in results.items()}},
        }
        if manifest_extra is not None:
            manifest |= manifest_extra()
        atomic_write_json(self.path / MANIFEST, manifest)
        write_card(self.path, self.step, files)
        if self.remote is not None:  # a killed run's shards that no task kept: gone before _SUCCESS
            listed = set(files) | {MANIFEST, CARD}
            self.remote.remove([r for r in self.remote.listing() if "/" not in r and r not in listed
                                and not r.startswith(("_", "."))])
        atomic_write_bytes(self.path / SUCCESS, b"")  # last; never through a link planted there
        self.push(final=True)  # in the store too: _SUCCESS after everything else


def _nearest(path: Path) -> Path | None:
    """``path`` or its nearest ancestor that exists (None: none does)."""
    return next((p for p in (path, *path.parents) if os.path.lexists(p)), None)


def unwritable(path: Path, e: OSError, option: str = "--out") -> CptkitError:
    """The one line for an output ``path`` that cannot be made (``e``: why): a file on the way to it,
    a read-only file system, no permission."""
    path = Path(path)
    found = _nearest(path.parent)
    if found is not None and not found.is_dir():
        why = f"{found} is a file, not a directory"
    elif e.errno == errno.EROFS:
        why = "it is on a read-only file system"
    else:
        why = (e.strerror or type(e).__name__).lower()
    return CptkitError(f"{option} {path}: cannot be written: {why}")


def check_output_file(path: Any, option: str = "--out") -> Path:
    """``path`` as the one file a step writes, checked before any work: refused with one line when it
    is a directory, when a part of the way to it is a file, or when its directory cannot be written
    (a read-only file system, no permission). Nothing is made."""
    p = Path(str(path))
    if p.is_dir():
        raise CptkitError(f"{option} {p}: is an existing directory; pass the path of a file")
    found = _nearest(p.parent) or Path(".")
    if not found.is_dir():
        raise unwritable(p, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), option)
    if not os.access(found, os.W_OK | os.X_OK):
        readonly = bool(os.statvfs(found).f_flag & os.ST_RDONLY)
        code = errno.EROFS if readonly else errno.EACCES
        raise unwritable(p, OSError(code, os.strerror(code)), option)
    return p


def is_finished(out: Path) -> bool:
    """Whether ``out`` is a finished output: its ``_SUCCESS`` is a file (a link is never one cptkit wrote)."""
    return (out / SUCCESS).is_file() and not (out / SUCCESS).is_symlink()


def _inside(name: str, owned: tuple[str, ...], lock: bool = False) -> str:
    """``name`` as a relative path below a directory, refusing one that climbs out or names a file
    the output protocol owns (a step's bug, not bad input: ValueError)."""
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts or parts[0] in owned or (lock and parts[0].startswith("lock-")):
        raise ValueError(f"{name!r}: not a step's own file name inside an output")
    return name


@contextmanager
def writing(out: Path) -> Iterator[Path]:
    """A folder written in one go outside a step run (a ``python -m`` tool): made, unfinished while it
    is written (an earlier ``_SUCCESS`` removed), and given ``_SUCCESS`` last when the block succeeds."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUCCESS).unlink(missing_ok=True)
    yield out
    atomic_write_bytes(out / SUCCESS, b"")


def read_manifest(out: Path) -> dict[str, Any]:
    """An output's ``_manifest.json`` (OSError when it has none, ValueError when it is no JSON)."""
    return json.loads((Path(out) / MANIFEST).read_text())


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write ``out/_manifest.json`` of a folder written with :func:`writing` (secrets masked)."""
    atomic_write_json(Path(out) / MANIFEST, manifest)


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
