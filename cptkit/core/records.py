"""The record: one JSON object per line with a unique string ``id`` and a ``text``.

Optional fields every step understands: ``source``, ``url``, ``lang``, ``meta`` (or
``metadata``, its datatrove/dolma name). Steps add fields and keep every field they do not know.
See docs/records.md.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cptkit.core.errors import BadInput

Record = dict[str, Any]


def validate(obj: Any) -> str | None:
    """Return why ``obj`` is not a valid record, or None when it is."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    rid = obj.get("id")
    if rid is None:
        return "record has no 'id'"
    if not isinstance(rid, str) or not rid:
        return f"'id' must be a non-empty string, got {json.dumps(rid)}"
    text = obj.get("text")
    if text is None:
        return f"record {rid!r} has no 'text'"
    if not isinstance(text, str):
        return f"record {rid!r}: 'text' must be a string, got {type(text).__name__}"
    for name in ("meta", "metadata"):
        if obj.get(name) is not None and not isinstance(obj[name], dict):
            return f"record {rid!r}: {name!r} must be an object, got {type(obj[name]).__name__}"
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # tab, line breaks and every other control character


def plain_id_problem(rid: str) -> str | None:
    """Why ``rid`` cannot be a column of a tab-separated file (``retrieve``'s ``_run.tsv``): it holds a
    tab, a line break or another control character. None when it can."""
    m = _CONTROL.search(rid)
    if m is None:
        return None
    shown = rid if len(rid) <= 80 else rid[:80] + "..."
    return (f"id {shown!r} holds {m.group()!r} (character {m.start() + 1}): ids written to tab-separated files "
            "must have no tab, line break or control character")


# json.dumps(rec, ensure_ascii=False, separators=(",", ":")) builds an encoder per call; one shared
# encoder gives the same bytes (it keeps no state between calls)
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dumps(rec: Record) -> str:
    """Serialise a record as one compact JSON line (no trailing newline), UTF-8 kept as is."""
    return _ENCODE(rec)


def meta(rec: Record) -> dict[str, Any]:
    """The record's free-form metadata: ``meta``, or ``metadata`` (datatrove's and dolma's name)."""
    m = rec.get("meta")
    if m is None:
        m = rec.get("metadata")
    return m if isinstance(m, dict) else {}


def field_value(rec: Record, key: str) -> Any:
    """A field by dotted path (``meta.topic``); ``meta.x`` also finds ``metadata.x``, and a plain
    key missing from the record is looked up in its metadata."""
    parts = key.split(".")
    if parts[0] in ("meta", "metadata") and parts[0] not in rec:
        cur: Any = meta(rec)
        parts = parts[1:]
    else:
        cur = rec
    for part in parts:
        if not isinstance(cur, dict) or part not in cur:
            cur = None
            break
        cur = cur[part]
    if cur is None and len(parts) == 1 and key == parts[0]:
        cur = meta(rec).get(key)
    return cur


def jsonl_lines(path: Path | str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(line, object)`` for every non-blank line of a JSONL file (``.gz`` too), the line without its
    line break. A malformed line, or one that is not a JSON object, is :class:`BadInput` naming it."""
    path = Path(path)
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInput(str(path), n, f"malformed JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise BadInput(str(path), n, "expected a JSON object")
            yield line.rstrip("\r\n"), obj


def read_jsonl(path: Path | str, missing_ok: bool = False) -> list[dict[str, Any]]:
    """The objects of a JSONL file (metrics and weight logs, benchmark files); blank lines skipped.
    ``missing_ok``: a file that does not exist reads as no rows (a log not written yet)."""
    if missing_ok and not Path(path).exists():
        return []
    return [obj for _, obj in jsonl_lines(path)]
