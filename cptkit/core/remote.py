"""Object stores as ``--in`` and ``--out``: fsspec URLs (``s3://``, ``gs://``, ...); ``file://`` is a local path.

Credentials come from the environment as boto and fsspec read them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL`` for an
S3-compatible server; ``GOOGLE_APPLICATION_CREDENTIALS``), never from the config; their values
are masked like every secret (:mod:`cptkit.core.redact`), and a store's error is one line.

Reading (:func:`resolve`, :func:`open_raw`, :func:`fingerprint`): a prefix lists its data objects as
a directory does; an object is read as a stream of ranged reads (never downloaded whole first);
an input's fingerprint is its size and ETag (checksum), not a modification time.

Writing (:class:`RemoteOutput`): a step writes into a local staging directory with the local
guarantees, and :class:`cptkit.core.output.OutputDir` mirrors it to the store (docs/records.md,
"Outputs in an object store"):

* each file is uploaded whole from a finished local file: one PUT, or a multipart upload that
  appears only once completed, so a shard is there whole or not at all;
* a task's shards before its marker, run state before markers, ``_SUCCESS`` last of all;
* the writer's lock is a conditional put (``If-None-Match: *``) of ``.cptkit/lock-I-of-N``: a second
  writer gets 412 from the store, not a check-then-write race;
* a rerun pulls the run state (markers, identity, fingerprints) and resumes from it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import IO, Any

from cptkit.core.errors import CptkitError
from cptkit.core.procs import TMP_PID, pid_alive

LOCAL_SCHEMES = ("file", "local")
# run state that is a cache, never mirrored: dedup's serialised records of phase 1 (re-read from the inputs)
UNSHARED_STATE = ("lines-",)


def scheme(spec: str) -> str | None:
    """The URL scheme of ``spec`` (``s3``), or None for a plain path."""
    head, sep, _ = str(spec).partition("://")
    return head.lower() if sep and head.replace("+", "").replace("-", "").isalnum() else None


def is_url(spec: Any) -> bool:
    """Whether ``spec`` names an object in a store (any fsspec URL but ``file://``)."""
    s = scheme(str(spec))
    return s is not None and s not in LOCAL_SCHEMES


def local_path(spec: str) -> str:
    """``file:///a/b`` -> ``/a/b``; any other spec as it is."""
    return spec[len("file://"):] if str(spec).lower().startswith("file://") else spec


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


@functools.lru_cache(maxsize=16)
def _fs(protocol: str, _env: tuple, _pid: int):
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as e:
        raise CptkitError(f"{protocol}:// URLs need fsspec's {protocol} backend: {e}") from None
    return cls(skip_instance_cache=True)


def fs_of(url: str):
    """(the fsspec filesystem, the path within it) of ``url``; credentials from the environment (one
    filesystem per process and set of ``AWS_*``/``GOOGLE_*``/``FSSPEC_*`` variables)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_", "FSSPEC_"))))
    fs = _fs(scheme(url) or "file", env, os.getpid())
    return fs, fs._strip_protocol(url)


def store_error(url: str, e: BaseException) -> CptkitError:
    """One line for a store's error: a missing bucket, a refused credential, no route to the store."""
    msg = " ".join(str(e).split()) or type(e).__name__
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if isinstance(e, PermissionError) or "AccessDenied" in msg or "SignatureDoesNotMatch" in msg or "Forbidden" in msg:
        return CptkitError(f"{url}: access denied by the store ({msg}); check the credentials in the environment "
                           "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS)")
    if "NoSuchBucket" in msg or "bucket does not exist" in msg.lower():
        return CptkitError(f"{url}: no bucket {bucket!r} in the store ({msg})")
    if "credentials" in msg.lower() and ("unable" in msg.lower() or "no " in msg.lower()):
        return CptkitError(f"{url}: no credentials for the store ({msg}); set AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment")
    if isinstance(e, FileNotFoundError):
        return CptkitError(f"{url}: no such object or prefix")
    return CptkitError(f"{url}: the store failed: {msg}")


def _call(url: str, fn, *args, **kw):
    """``fn(*args, **kw)``, a store's error as one line (:func:`store_error`)."""
    try:
        return fn(*args, **kw)
    except CptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - botocore, aiohttp and fsspec errors alike
        raise store_error(url, e) from None


def _etag(info: dict) -> str | None:
    for key in ("ETag", "etag", "md5Hash", "crc32c", "checksum"):
        if info.get(key):
            return str(info[key]).strip('"')
    return None


def _url(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def resolve(spec: str, data_name, allow_partial: bool = False, make: Any = tuple) -> list:
    """The input shards an object-store ``spec`` names: an object, a prefix (its data objects,
    recursively, sorted; ``_``/``.`` names skipped) or a glob. ``data_name(name)``: whether an object
    name is a data file. A step's output without ``_SUCCESS`` is refused unless ``allow_partial``.
    ``make(url, size, key)`` builds each (:class:`cptkit.core.shards.InputFile`, which reads through here)."""

    fs, path = fs_of(spec)
    fs.invalidate_cache()  # listings are read fresh: another process may have written since
    if any(ch in path for ch in "*?["):
        found = _call(spec, fs.glob, path, detail=True)
        files = [make(_url(fs, p), int(i.get("size") or 0), _url(fs, p)) for p, i in sorted(found.items())
                 if i.get("type") != "directory" and data_name(p.rsplit("/", 1)[-1])]
        if not files:
            raise CptkitError(f"{spec}: glob matches no data objects")
        return files
    listing = _call(spec, fs.find, path.rstrip("/"), detail=True)
    prefix = path.rstrip("/") + "/"
    inside = {p[len(prefix):]: i for p, i in listing.items() if p.startswith(prefix)}
    if not inside:
        if path.rstrip("/") in listing or _call(spec, fs.isfile, path):
            info = listing.get(path.rstrip("/")) or _call(spec, fs.info, path)
            return [make(_url(fs, path.rstrip("/")), int(info.get("size") or 0), _url(fs, path.rstrip("/")))]
        raise CptkitError(f"{spec}: no such object or prefix")
    rows = []
    for rel, info in inside.items():
        parts = rel.split("/")
        if info.get("type") == "directory" or any(p[:1] in ("_", ".") for p in parts) or not data_name(parts[-1]):
            continue
        rows.append((tuple(parts), make(_url(fs, prefix + rel), int(info.get("size") or 0), _url(fs, prefix + rel))))
    state = any(r.startswith(".cptkit/") for r in inside)
    done = "_SUCCESS" in inside
    if state and not done and not allow_partial:
        raise CptkitError(f"{spec}: a step's output without _SUCCESS (still running, or it died): its shards may be "
                          "partial; rerun that step to finish it, or pass --allow-partial")
    if not rows and not done:
        raise CptkitError(f"{spec}: prefix holds no .jsonl/.jsonl.gz/.jsonl.zst/.parquet shards or .warc.gz/.wet.gz "
                          "archives")
    return [f for _, f in sorted(rows, key=lambda r: r[0])]


def open_raw(url: str, block_size: int = 4 * 2**20) -> IO[bytes]:
    """An object opened for reading as a stream: ranged reads of ``block_size`` bytes, read ahead
    (the first record is read before the rest of the object is fetched)."""
    fs, path = fs_of(url)
    return _call(url, fs.open, path, "rb", block_size=block_size, cache_type="readahead")


def fingerprint(url: str) -> dict[str, Any]:
    """What a task read from an object: its URL, size and ETag (the store's checksum of its bytes)."""
    fs, path = fs_of(url)
    fs.invalidate_cache(path)
    info = _call(url, fs.info, path)
    return {"path": url, "size": int(info.get("size") or 0), "mtime_ns": None, "etag": _etag(info)}


def output_file(out: str, name: str) -> bytes | None:
    """The bytes of the file ``name`` of the output ``out`` (a directory or a store URL), or None."""
    out = local_path(out)
    if not is_url(out):
        p = Path(out) / name
        return p.read_bytes() if p.is_file() else None
    fs, path = fs_of(out)
    try:
        return fs.cat_file(f"{path.rstrip('/')}/{name}")
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001
        raise store_error(out, e) from None


def local_copy(url: str) -> Path:
    """A local copy of everything under the prefix ``url`` but locks (an index to memory-map), in a
    directory of this process under ``$CPTKIT_STAGING`` that is removed when the process exits."""
    import atexit

    fs, path = fs_of(url)
    fs.invalidate_cache()
    root = path.rstrip("/")
    found = {p[len(root) + 1:]: p for p in _call(url, fs.find, root) if p.startswith(root + "/")}
    if not found:
        raise CptkitError(f"{url}: no such object or prefix")
    dest = staging_dir(url, 0, 1)
    atexit.register(shutil.rmtree, dest, True)
    for rel, key in sorted(found.items()):
        if rel.rsplit("/", 1)[-1].startswith("lock-"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        _call(url, fs.get_file, key, str(dest / rel))
    return dest


def staging_dir(url: str, index: int, count: int) -> Path:
    """A new local directory (made by :meth:`OutputDir.open`) where this process writes its slice of the output ``url`` before it is
    uploaded: under ``$CPTKIT_STAGING`` (default: the system's temporary directory), its own for each
    process (nothing is shared between nodes but the store, which holds the state: every run starts
    its staging directory empty and pulls that state)."""
    import tempfile

    root = os.environ.get("CPTKIT_STAGING") or tempfile.gettempdir()
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return Path(root) / f"cptkit-out-{key}-{index:05d}-of-{count:05d}-{os.getpid()}-{os.urandom(4).hex()}"


class RemoteOutput:
    """The object-store side of an output: its lock, and the mirror of a local staging directory."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.root = fs_of(self.url)
        self.lock_key: str | None = None
        self.lock_body = b""
        self.host = socket.gethostname()
        self.pushed: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) as last uploaded
        self.known: set[str] = set()  # relative paths this process pulled or uploaded (it may delete them)

    def key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def call(self, fn, *args, **kw):
        return _call(self.url, fn, *args, **kw)

    def listing(self, sub: str = "") -> dict[str, dict]:
        """Objects under the output (or under ``sub``), by relative path."""
        base = self.root + "/" + sub if sub else self.root
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(base.rstrip("/"), detail=True)
        except FileNotFoundError as e:
            if "bucket" in str(e).lower():
                raise store_error(self.url, e) from None
            return {}
        except Exception as e:  # noqa: BLE001
            raise store_error(self.url, e) from None
        prefix = self.root + "/"
        return {p[len(prefix):]: i for p, i in found.items() if p.startswith(prefix) and i.get("type") != "directory"}

    # -- the lock --------------------------------------------------------------------------
    def acquire(self, index: int, count: int, wait_s: float = 0.0) -> None:
        """Take ``.cptkit/lock-IIIII-of-NNNNN`` with a conditional put; a live holder (or a run with
        another ``shard.count``) refuses, or makes this run wait up to ``wait_s``. A lock of a dead
        process on this host is taken over."""
        rel = f".cptkit/lock-{index:05d}-of-{count:05d}"
        me = {"pid": os.getpid(), "host": self.host, "started": time.time(), "index": index, "count": count,
              "nonce": hashlib.sha256(os.urandom(16)).hexdigest()[:16]}
        body = json.dumps(me).encode()
        deadline = time.monotonic() + wait_s
        while True:
            holder = None
            for other, _ in self.listing(".cptkit/").items():
                if other.startswith(".cptkit/lock-") and other != rel:
                    info = self._read_lock(other)
                    if info is not None and int(info.get("count", 0)) != count and not self._stale(other, info):
                        holder = info
            if holder is None:
                try:
                    self.fs.pipe_file(self.key(rel), body, mode="create")
                    self.lock_key, self.lock_body = rel, body
                    return
                except FileExistsError:
                    holder = self._read_lock(rel)
                    if holder is not None and self._stale(rel, holder):
                        continue
                    holder = holder or {"pid": "?", "host": "?"}
                except Exception as e:  # noqa: BLE001
                    raise store_error(self.url, e) from None
            if time.monotonic() >= deadline:
                since = time.strftime("%H:%M:%S", time.localtime(float(holder.get("started", 0) or 0)))
                raise CptkitError(f"{self.url}: another cptkit run is writing this output (pid {holder.get('pid')} on "
                                  f"{holder.get('host')}, since {since}; its lock {self.url}/{rel}); wait for it to "
                                  "end or pass io.lock_wait_s=SECONDS, or, if that run is gone, delete the lock object")
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))

    def _read_lock(self, rel: str) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(self.key(rel)))
        except Exception:  # noqa: BLE001 - gone meanwhile, or unreadable
            return None

    def _stale(self, rel: str, info: dict) -> bool:
        """A lock of a process on this host that is gone: removed (then False: the caller retries)."""
        if info.get("host") != self.host or pid_alive(int(info.get("pid", 0) or 0)):
            return False
        try:
            self.fs.rm_file(self.key(rel))
        except FileNotFoundError:
            pass
        return True

    def release(self) -> None:
        if self.lock_key is None:
            return
        try:
            if self.fs.cat_file(self.key(self.lock_key)) == self.lock_body:
                self.fs.rm_file(self.key(self.lock_key))
        except Exception:  # noqa: BLE001 - a lock already gone, a store unreachable: nothing more to do
            pass
        self.lock_key = None

    # -- the mirror ------------------------------------------------------------------------
    def pull(self, staging: Path, sub: str = "") -> dict[str, dict]:
        """Download the output's run state (``.cptkit/``, less locks and caches) and its ``_manifest.json``,
        ``_SUCCESS`` into ``staging``; ``sub``: only that part of the run state. Returns the listing."""
        found = self.listing()
        for rel, _ in sorted(found.items()):
            name = rel.rsplit("/", 1)[-1]
            want = (rel.startswith(".cptkit/") and not name.startswith(("lock-", ".", *UNSHARED_STATE))) \
                or rel in ("_SUCCESS", "_manifest.json")
            if not want or not rel.startswith(sub):
                continue
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.call(self.fs.get_file, self.key(rel), str(dest))
            st = dest.stat()
            self.pushed[rel] = (st.st_size, st.st_mtime_ns)
            self.known.add(rel)
        return found

    def fetch(self, rel: str, dest: Path, write: Any) -> bool:
        """Download the object ``rel`` to ``dest`` with ``write(dest, data)`` (an atomic writer) if the
        store has it (a marker another process wrote)."""
        try:
            data = self.fs.cat_file(self.key(rel))
        except FileNotFoundError:
            return False
        except Exception as e:  # noqa: BLE001
            raise store_error(self.url, e) from None
        write(dest, data)
        st = dest.stat()
        self.pushed[rel] = (st.st_size, st.st_mtime_ns)
        self.known.add(rel)
        return True

    def push(self, staging: Path, final: bool = False) -> None:
        """Upload what changed in ``staging`` since the last push: data files and side outputs, then run
        state, then task markers; with ``final``, ``_SUCCESS`` last of all. Each file is one complete
        object (a PUT, or a multipart upload completed at its end). A file this process uploaded or
        pulled and has since removed (a task redone, an output cleared) is deleted from the store."""
        files: dict[str, tuple[int, int]] = {}
        for root, dirs, names in os.walk(staging):
            dirs.sort()
            for n in sorted(names):
                p = Path(root) / n
                rel = p.relative_to(staging).as_posix()
                if TMP_PID.match(n) or (rel.startswith(".cptkit/") and n.startswith(("lock-", *UNSHARED_STATE))):
                    continue
                if not p.is_file() or p.is_symlink():
                    continue
                st = p.stat()
                files[rel] = (st.st_size, st.st_mtime_ns)

        def rank(rel: str) -> int:
            if rel == "_SUCCESS":
                return 4
            if rel.startswith(".cptkit/done/"):
                return 3
            if rel.startswith(".cptkit/"):
                return 2
            return 1 if rel.startswith("_") or rel == "README.md" else 0

        for rel in sorted(files, key=lambda r: (rank(r), r)):
            if rel == "_SUCCESS" and not final:
                continue
            if self.pushed.get(rel) == files[rel]:
                continue
            self.call(self.fs.put_file, str(staging / rel), self.key(rel))
            self.pushed[rel] = files[rel]
            self.known.add(rel)
        self.remove(sorted(self.known - set(files)))

    def remove(self, rels: list[str]) -> None:
        """Delete objects of the output (relative paths), e.g. a redone task's earlier shards."""
        for rel in rels:
            try:
                self.fs.rm_file(self.key(rel))
            except FileNotFoundError:
                pass
            except Exception as e:  # noqa: BLE001
                raise store_error(self.url, e) from None
            self.known.discard(rel)
            self.pushed.pop(rel, None)


def fresh_dir(path: Path) -> None:
    """Make ``path`` an empty directory (a staging directory at the start of a run)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, mode=0o700)
