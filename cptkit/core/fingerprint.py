"""Content fingerprints of what a run reads: the sha256 of a file, or of every file under a
directory (a model, a tokenizer, a stream), so that an input edited in place, even to the same
size with its mtime restored, is seen as changed. With the config hash they make a run's
identity (:func:`config_hash`, :func:`fingerprint`, :func:`input_changes`), which an output
directory compares with its earlier run's (:mod:`cptkit.core.output`).

Each file is hashed once: the digest is cached by absolute path with the file's inode, size,
mtime and ctime (ctime changes on every write, even when mtime is set back), in
``$CPTKIT_CACHE/hashes.json`` (default ``~/.cache/cptkit``). A cache that cannot be read or
written only costs a re-hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from cptkit.core import remote
from cptkit.core.config import IOConfig
from cptkit.core.procs import TMP_PID, pid_alive
from cptkit.core.shards import STDIO, InputFile, open_new

CACHE_FILE = "hashes.json"
BOOKKEEPING = frozenset({"_manifest.json", "_SUCCESS"})  # a cptkit output's run records (timings), not its data
_SMALL = 1 << 20  # bytes read at once to hash a file; bigger files are read in chunks


def cache_path() -> Path:
    return Path(os.environ.get("CPTKIT_CACHE", Path.home() / ".cache" / "cptkit")).expanduser() / CACHE_FILE


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class HashCache:
    """``{absolute path: {"stat": [dev, inode, size, mtime_ns, ctime_ns], "sha256": hex}}`` on disk."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries: dict[str, dict[str, Any]] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.dirty = False

    def file_sha256(self, path: Path) -> str:
        """The file's sha256, read only when its stat signature is not the cached one."""
        key = str(path)
        sig = _signature(path.stat())
        hit = self.entries.get(key)
        if isinstance(hit, dict) and hit.get("stat") == sig and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
        with open(path, "rb") as f:  # a small file in one read (inputs can be many tiny files)
            digest = (hashlib.sha256(f.read()) if sig[2] <= _SMALL else hashlib.file_digest(f, "sha256")).hexdigest()
        after = _signature(path.stat())
        if after == sig:  # not written while we read it: safe to remember
            self.entries[key] = {"stat": sig, "sha256": digest}
            self.dirty = True
        return digest

    def save(self) -> None:
        """Write the cache (merged with entries other processes added meanwhile, less those of
        files that are gone); errors are ignored."""
        if not self.dirty:
            return
        try:
            merged = {**json.loads(self.path.read_text()), **self.entries}
        except (OSError, ValueError):
            merged = dict(self.entries)
        merged = {k: v for k, v in merged.items() if os.path.exists(k)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            remove_dead_tmps(self.path)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with open_new(tmp) as f:
                f.write(json.dumps(merged, sort_keys=True).encode())
            os.replace(tmp, self.path)
            self.entries, self.dirty = merged, False
        except OSError:
            pass




def remove_dead_tmps(path: Path, pattern: str | None = None,
                     live: Callable[[], Collection[int]] | None = None) -> list[Path]:
    """Delete the temporary files of writers killed mid-write; returns them. By default the
    ``.NAME.<pid>.tmp`` files next to ``path``; with ``pattern``, the files that glob matches in the
    directory ``path`` whose names end in ``.<pid>.tmp`` or ``.tmp-<pid>``. A writer is gone when
    its pid is not a live process or, given ``live()`` (the pids of the writers at work, asked
    after the files are listed, so that a writer starting meanwhile is not missed), not one of them."""
    found = list(path.glob(pattern) if pattern else path.parent.glob(f".{path.name}.*.tmp"))
    pids = {}
    for t in found:
        m = TMP_PID.match(t.name)
        if m is not None and int(m.group(1) or m.group(2)) > 0 and (t.is_symlink() or not t.is_dir()):
            pids[t] = int(m.group(1) or m.group(2))
    working = set(live()) if live is not None and pids else None
    removed = []
    for t, pid in pids.items():
        if (pid in working) if working is not None else pid_alive(pid):
            continue
        try:
            t.unlink()
            removed.append(t)
        except FileNotFoundError:
            pass
    return removed


_CACHES: dict[tuple[str | None, str | None], HashCache] = {}


def cache() -> HashCache:
    """This process's cache for the current ``$CPTKIT_CACHE`` (and ``$HOME``)."""
    key = (os.environ.get("CPTKIT_CACHE"), os.environ.get("HOME"))
    if key not in _CACHES:
        _CACHES[key] = HashCache(cache_path())
    return _CACHES[key]


def content_hash(path: str | Path) -> tuple[str, int] | None:
    """(sha256, bytes) of a file, or of a directory's files (relative names and digests, sorted;
    names starting with ``.`` (run state, locks) and a cptkit output's ``_manifest.json`` and
    ``_SUCCESS`` skipped: a model rerun to the same files is the same model); None when the path
    does not exist."""
    p = Path(path).resolve()
    c = cache()
    if p.is_file():
        return c.file_sha256(p), p.stat().st_size
    if not p.is_dir():
        return None
    h, total = hashlib.sha256(), 0
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or name in BOOKKEEPING:
                continue
            f = Path(root) / name
            if not f.is_file():
                continue
            h.update(f"{f.relative_to(p).as_posix()}\0{c.file_sha256(f)}\n".encode())
            total += f.stat().st_size
    return h.hexdigest(), total


# -- what a run is: its config hash and the fingerprints of what it reads ----------------------

IO_DEFAULTS = {"max_record_chars": IOConfig().max_record_chars, "oversize": IOConfig().oversize,
               "html_extractor": IOConfig().html_extractor}


def config_hash(cfg: dict) -> str:
    """Hash of the config that determines the output (not I/O locations or verbosity). ``cfg`` is a
    run's record: keys added later are already left out at their unused values
    (:data:`cptkit.core.run.LATER_KEYS`)."""
    keep = {k: v for k, v in cfg.items() if k not in ("io", "quiet", "overrides")}
    keep["shard"] = {k: v for k, v in cfg.get("shard", {}).items() if k not in ("index", "count")}
    io = cfg.get("io", {})
    for key in ("max_record_chars", "oversize", "html_extractor"):  # they change what is read
        if key in io and io[key] != IO_DEFAULTS.get(key):
            keep[f"io.{key}"] = io[key]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint(inp: InputFile) -> dict[str, Any]:
    """What a task read from one input: absolute path, size, modification time (ns) and the
    sha256 of its contents (cached: :func:`cache`)."""
    if inp.path == STDIO:
        return {"path": STDIO}
    if remote.is_url(inp.path):  # an object in a store: its size and ETag
        return remote.fingerprint(inp.path)
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
                    "sha256": cache().file_sha256(Path(real))}
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
    if "etag" in old and "etag" in new:  # an object in a store: its checksum, never a time
        return old.get("size") == new.get("size") and old["etag"] == new["etag"] and old["etag"] is not None
    keys = ("size", "sha256") if "sha256" in old and "sha256" in new else ("size", "mtime_ns")
    return all(old.get(k) == new.get(k) for k in keys)


def short(path: str) -> str:
    """``path`` relative to the working directory where it can be (for messages)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def input_changes(old: list[dict], new: list[dict]) -> tuple[list[str], list[str]]:
    """(why the input SET differs, which same-path files changed) between two fingerprint lists."""
    o, n = {f["path"]: f for f in old}, {f["path"]: f for f in new}
    set_diff = [f"{short(p)} is a new input" for p in n if p not in o]
    set_diff += [f"{short(p)} is no longer an input" for p in o if p not in n]
    changed = [p for p in n if p in o and not same_read(o[p], n[p])]
    return set_diff, changed


def describe_change(path: str, old: dict | None, new: dict) -> str:
    """One phrase saying how the file at ``path`` changed since the fingerprint ``old``."""
    if path == STDIO:
        return "stdin (-) cannot be compared with what an earlier run read"
    if old is not None and old.get("size") != new.get("size"):
        return f"{short(path)} changed (size {old.get('size')} -> {new.get('size')} bytes)"
    return f"{short(path)} changed (its contents differ from what the earlier run read)"
