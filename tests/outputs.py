"""Reading a step's output in tests, one way everywhere: its shard files, their records, its manifest.

A step writes its records as ``part-NNNNN-MMMM.jsonl[.gz]`` shards beside ``_manifest.json`` and
``_SUCCESS`` (docs/records.md); these helpers are the only place the tests spell that layout out.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

SHARD_PREFIX = "part-"
MANIFEST = "_manifest.json"


def shard_paths(out: str | Path, suffix: str = "", task: int | None = None) -> list[Path]:
    """The output's shard files in shard order; ``suffix`` (``".jsonl.gz"``) keeps those ending so,
    ``task`` those that task wrote (``part-00001-*``)."""
    head = SHARD_PREFIX if task is None else f"{SHARD_PREFIX}{task:05d}-"
    return sorted(Path(out).glob(f"{head}*{suffix}"))


def shard_files(out: str | Path, suffix: str = "") -> dict[str, bytes]:
    """Each shard's name and its bytes as stored (compressed or not): for byte-identity checks."""
    return {p.name: p.read_bytes() for p in shard_paths(out, suffix)}


def shard_text(path: str | Path) -> bytes:
    """One shard's JSON lines, decompressed when it is gzip."""
    path = Path(path)
    return gzip.open(path).read() if path.name.endswith(".gz") else path.read_bytes()


def output_text(out: str | Path, suffix: str = ".jsonl.gz") -> bytes:
    """Every shard's JSON lines, decompressed and joined in shard order."""
    return b"".join(shard_text(p) for p in shard_paths(out, suffix))


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of one JSONL file (gzip when it ends in ``.gz``), as written; blank lines skipped
    (lines end at ``\n`` only: a text may hold U+2028)."""
    return [json.loads(x) for x in shard_text(path).decode("utf-8").split("\n") if x.strip()]


def records(out: str | Path, suffix: str = ".jsonl.gz") -> list[dict]:
    """The records of the output's shards, as written (no validation), in shard order."""
    return [r for p in shard_paths(out, suffix) for r in read_jsonl(p)]


def read_jsonl_dir(directory: str | Path) -> list[dict]:
    """All records of a step's output directory (or any ``--in`` spec), in shard order, read as a
    step reads its input (cptkit's reader: each record checked)."""
    from cptkit.core.shards import read_records, resolve_inputs

    return [r for inp in resolve_inputs(str(directory)) for r in read_records(inp)]


def read_manifest(out: str | Path) -> dict[str, Any]:
    """The output's ``_manifest.json``."""
    return json.loads((Path(out) / MANIFEST).read_text(encoding="utf-8"))
