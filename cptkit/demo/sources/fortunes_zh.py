"""The fortunes-zh source: strfile text files (``fortunes-zh``), entries separated by ``%`` lines;
one record per fortune."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import (
    clean_text,
    meta,
    strip_ansi,
)


def split_fortunes(text: str) -> list[str]:
    """Entries of a fortune file (``%`` lines separate them), ANSI codes stripped."""
    entries, cur = [], []
    for line in text.splitlines():
        if line.strip() == "%":
            entries.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    entries.append("\n".join(cur))
    return [e for e in (clean_text(strip_ansi(e)) for e in entries) if e.strip()]


def fortunes_zh_records(root: Path, min_chars: int = 10) -> Iterator[Record]:
    """One record per fortune of every fortune file (``.dat`` indexes and ``.u8`` links skipped)."""
    base = root / "usr/share/games/fortunes"
    if not base.is_dir():
        raise CptkitError(f"{base}: not found in the unpacked fortunes-zh package")
    files = sorted(p for p in base.iterdir()
                   if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8"))
    for path in files:
        for k, entry in enumerate(split_fortunes(path.read_text(encoding="utf-8", errors="replace")), 1):
            if len(entry) < min_chars:
                continue
            first = entry.splitlines()[0].strip()
            title = first if first.startswith("《") else ""
            yield {
                "id": f"fortunes-zh/{path.name}/{k:05d}",
                "text": entry,
                "source": "fortunes-zh",
                "url": f"fortune://{path.name}/{k}",
                "lang": "zh",
                "meta": meta(title or first, path.name, "fortunes-zh"),
            }
