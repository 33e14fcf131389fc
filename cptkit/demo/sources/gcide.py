"""The gcide source: the Collaborative International Dictionary of English in dictd format
(``dict-gcide``), one record per entry (short ones merged)."""

from __future__ import annotations

import gzip
import re
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import (
    IdMaker,
    clean_text,
    meta,
)

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VAL = {c: i for i, c in enumerate(_B64)}


def dictd_b64(s: str) -> int:
    """Decode a dictd index number (big-endian base 64: ``A``=0 ... ``/``=63)."""
    v = 0
    for c in s:
        if c not in _B64_VAL:
            raise ValueError(f"invalid dictd base64 digit {c!r} in {s!r}")
        v = v * 64 + _B64_VAL[c]
    return v


def parse_dictd_index(lines: Iterable[str], path: str = "<index>") -> list[tuple[str, int, int]]:
    """``(headword, offset, length)`` for every index line; ``00-database-*`` entries skipped."""
    out = []
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        parts = line.split("\t")
        if len(parts) < 3:
            raise CptkitError(f"{path}:{lineno}: expected 'word<TAB>offset<TAB>length'")
        word = parts[0]
        if word.startswith("00-database-") or word.startswith("00-") and word[3:].split("-")[0] in ("gcide", "web1913"):
            continue
        try:
            out.append((word, dictd_b64(parts[1]), dictd_b64(parts[2])))
        except ValueError as e:
            raise CptkitError(f"{path}:{lineno}: {e}") from None
    return out


def gcide_text(raw: str) -> str:
    """Light cleanup of a GCIDE entry: ``{cross refs}`` unbraced, accents kept as written."""
    return clean_text(textwrap.dedent(raw.replace("{", "").replace("}", "")))


def gcide_records(root: Path, min_chars: int = 200) -> Iterator[Record]:
    """One record per dictionary entry block (in file order); short entries merged forward."""
    base = root / "usr/share/dictd"
    index, data_path = base / "gcide.index", base / "gcide.dict.dz"
    if not index.exists() or not data_path.exists():
        raise CptkitError(f"{base}: gcide.index / gcide.dict.dz not found in the unpacked dict-gcide")
    with open(index, encoding="utf-8", errors="replace") as f:
        entries = parse_dictd_index(f, str(index))
    blocks: dict[tuple[int, int], str] = {}
    for word, off, length in entries:  # first headword in index order names the block
        blocks.setdefault((off, length), word)
    with gzip.open(data_path, "rb") as f:  # dictzip is gzip-compatible
        data = f.read()
    ids = IdMaker()
    pending: list[tuple[str, str]] = []
    for (off, length), word in sorted(blocks.items()):
        raw = data[off: off + length]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("cp1252", errors="replace")
        head = re.match(r"^([^\\\n]+?)\s*\\", text)
        word = head.group(1).strip() if head and len(head.group(1)) < 80 else word
        pending.append((word, gcide_text(text)))
        if sum(len(t) for _, t in pending) + 2 * (len(pending) - 1) < min_chars:
            continue
        yield _gcide_record(pending, ids)
        pending = []
    if pending:
        yield _gcide_record(pending, ids)


def _gcide_record(group: list[tuple[str, str]], ids: IdMaker) -> Record:
    word = group[0][0]
    return {
        "id": ids(f"gcide/{word}"),
        "text": "\n\n".join(t for _, t in group),
        "source": "gcide",
        "url": f"gcide://{word.replace(' ', '%20')}",
        "lang": "en",
        "meta": meta(word, "; ".join(w for w, _ in group), "dict-gcide"),
    }
