"""The record: one JSON object per line with a unique string ``id`` and a ``text``.

Optional fields every step understands: ``source``, ``url``, ``lang``, ``meta``. Steps add
fields and keep every field they do not know. See docs/records.md.
"""

from __future__ import annotations

import json
from typing import Any

Record = dict[str, Any]

REQUIRED = ("id", "text")
OPTIONAL = ("source", "url", "lang", "meta")


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
    return None


def dumps(rec: Record) -> str:
    """Serialise a record as one compact JSON line (no trailing newline), UTF-8 kept as is."""
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
