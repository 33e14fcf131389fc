"""The content-keyed caches under ``$CPTKIT_CACHE`` (default ``~/.cache/cptkit``): the dequantized
GGUF (``gguf/``), B0 (``b0/``), llama.cpp's requantized copies (``gguf-requant/``) and the untrained
model's held-out losses (``init_eval/``).

* **No links.** :func:`entry` refuses a symbolic link planted as a cache kind's directory or as an
  entry (``$CPTKIT_CACHE/b0/KEY -> /elsewhere``), as an output refuses one (:mod:`cptkit.core.output`):
  nothing is read from, trained into or deleted through it.
* **Integrity.** A directory entry is *sealed* once it is complete: :func:`seal` writes
  ``.cptkit-integrity.json``, the size and sha256 of every file under it, last. :func:`damage`
  compares the entry with that record (sizes always; hashes through the fingerprint cache, so a
  file is re-read only when its inode, size, mtime or ctime changed) and checks every
  ``.safetensors`` file's header against its length. A cut or edited file, a file gone, a link
  put in place of one, is damage: the caller rebuilds the entry (or refuses it) in one line,
  instead of loading it and failing later, somewhere else.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import cache as hash_cache
from cptkit.core.fingerprint import cache_path
from cptkit.core.shards import atomic_write_json

INTEGRITY = ".cptkit-integrity.json"  # {"files": {relative path: [size, sha256]}}, written last


def root() -> Path:
    """``$CPTKIT_CACHE`` (default ``~/.cache/cptkit``)."""
    return cache_path().parent


def entry(kind: str, name: str) -> Path:
    """``$CPTKIT_CACHE/kind/name``, refusing a symbolic link at ``kind`` or at ``name``."""
    path = root() / kind / name
    for p in (path.parent, path):
        if p.is_symlink():
            raise CptkitError(f"{p}: is a symbolic link inside the cache; cptkit keeps its caches in real files and "
                              f"directories and never follows a link there (remove it: {p} is rebuilt)")
    return path


def _files(directory: Path) -> dict[str, Path]:
    """The entry's files by relative path, less the run state of a cptkit output (``.cptkit/``) and
    the integrity record; a link among them is damage, reported by :func:`damage`."""
    out = {}
    for top, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not (top == str(directory) and d == ".cptkit"))
        for name in sorted(files):
            p = Path(top) / name
            rel = p.relative_to(directory).as_posix()
            if rel != INTEGRITY:
                out[rel] = p
    return out


def seal(directory: Path) -> None:
    """Record the size and sha256 of every file of the complete entry ``directory`` (written last)."""
    hashes = hash_cache()
    files = {}
    for rel, p in _files(directory).items():
        if p.is_symlink() or not p.is_file():
            raise CptkitError(f"{p}: is not a regular file; a cache entry holds only files it wrote")
        files[rel] = [p.stat().st_size, hashes.file_sha256(p)]
    hashes.save()
    atomic_write_json(directory / INTEGRITY, {"files": files}, indent=None)


def safetensors_damage(path: Path) -> str | None:
    """Why a ``.safetensors`` file cannot be whole (its header's tensors end past or before its
    length), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is {size:,} bytes, shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                return f"{path.name}: its header claims {n:,} bytes, the file has {size:,}"
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"{path.name}: unreadable safetensors header ({e})"
    if 8 + n + end != size:
        return f"{path.name} is {size:,} bytes, its tensors need {8 + n + end:,}"
    return None


def damage(directory: Path, hashes: bool = True) -> str | None:
    """Why the sealed entry ``directory`` is not as :func:`seal` recorded it (a file cut short,
    edited, missing, added or a link), or None when it is; ``"no integrity record"`` when it was
    never sealed. ``hashes``: compare contents too, not only sizes."""
    try:
        record = json.loads((directory / INTEGRITY).read_text())
        want = {str(k): (int(v[0]), str(v[1])) for k, v in record["files"].items()}
    except FileNotFoundError:
        return "no integrity record"
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"its integrity record {INTEGRITY} is unreadable"
    have = _files(directory)
    for rel in sorted(set(want) - set(have)):
        return f"{rel} is missing"
    for rel in sorted(set(have) - set(want)):
        return f"{rel} was not there when it was written"
    cache = hash_cache()
    try:
        for rel, (size, sha) in want.items():
            p = have[rel]
            if p.is_symlink() or not p.is_file():
                return f"{rel} is not a regular file"
            if p.stat().st_size != size:
                return f"{rel} is {p.stat().st_size:,} bytes, {size:,} when it was written"
            if rel.endswith(".safetensors") and (why := safetensors_damage(p)):
                return why
            if hashes and cache.file_sha256(p) != sha:
                return f"{rel} changed since it was written (sha256)"
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    finally:
        cache.save()
    return None


def legacy_damage(directory: Path) -> str | None:
    """For an entry complete by its own marker but written before integrity records: why its
    safetensors files cannot be whole (checked by their headers), or None (then it is sealed)."""
    for rel, p in _files(directory).items():
        if p.is_symlink() or not p.is_file():
            return f"{rel} is not a regular file"
        if rel.endswith(".safetensors") and (why := safetensors_damage(p)):
            return why
    return None


def check_or_seal(directory: Path) -> str | None:
    """:func:`damage` of a complete entry; one written before integrity records is checked by
    :func:`legacy_damage` and, whole, sealed now. None: the entry may be used."""
    why = damage(directory)
    if why != "no integrity record":
        return why
    why = legacy_damage(directory)
    if why is None:
        seal(directory)
    return why
