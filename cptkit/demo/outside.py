"""Text outside the demo corpus, for measuring forgetting: English fortune files from Debian.

Two sources that no demo step reads, built with ``cptkit demo-corpus --out DIR
corpus.sources=[NAME]`` (fetched, cached and unpacked as the demo corpus's packages are):

================  =================  ===================================================
source            package            role
================  =================  ===================================================
fortunes-en       fortunes           training text that re-adapts the shipped instruct
                                     model to raw English before the CPT (the "B0" base):
                                     quotations, poems, jokes, definitions (~2.5 M chars)
anarchism         fortune-anarchism  held-out English outside every training pool: the
                                     quotations of 200-1500 characters, deduplicated,
                                     with ``domain: outside`` for ``evaluate``
================  =================  ===================================================

Both are strfile text files (``%`` lines between entries, :func:`~cptkit.demo.sources.fortunes_zh.split_fortunes`).
An entry's hard-wrapped lines are joined into paragraphs and its attribution (``\\t\\t-- Name``)
loses its tabs (:func:`fortune_text`); entries that are mostly not letters (ASCII art) are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import Source, clean_text, content_hash, meta, unwrap
from cptkit.demo.sources.fortunes_zh import split_fortunes

FORTUNE_DIR = "usr/share/games/fortunes"
MIN_LETTER_SHARE = 0.6  # of an entry's non-space characters; ASCII art and tables fall below
OUTSIDE_MIN_CHARS, OUTSIDE_MAX_CHARS = 200, 1500  # a paragraph-sized held-out document


def fortune_text(entry: str) -> str:
    """One fortune as plain text: wrapped lines joined, the attribution's indentation dropped."""
    text = unwrap(entry.expandtabs(8))  # the attribution is indented: never joined to the quote
    return clean_text(re.sub(r"^[ \t]+(?=--\s)", "", text, flags=re.M))


def letter_share(text: str) -> float:
    """Share of letters among the non-space characters of ``text`` (0 when it has none)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 0.0


def fortune_files(root: Path, package: str) -> list[Path]:
    """The fortune text files of an unpacked package (``.dat`` indexes and ``.u8`` links skipped)."""
    base = root / FORTUNE_DIR
    if not base.is_dir():
        raise CptkitError(f"{base}: not found in the unpacked {package} package")
    files = sorted(p for p in base.iterdir()
                   if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8"))
    if not files:
        raise CptkitError(f"{base}: no fortune files in the unpacked {package} package")
    return files


def fortune_entries(path: Path) -> Iterator[tuple[int, str]]:
    """``(position from 1, text)`` of the prose entries of one fortune file."""
    raw = path.read_text(encoding="utf-8", errors="replace")
    for k, entry in enumerate(split_fortunes(raw), 1):
        text = fortune_text(entry)
        if text and letter_share(text) >= MIN_LETTER_SHARE:
            yield k, text


def _attribution(text: str) -> str:
    """The ``-- Name`` of a quotation (its last line), else its first line."""
    last = text.splitlines()[-1].strip()
    return last[2:].strip() if last.startswith("--") else text.splitlines()[0].strip()


def fortunes_en_records(root: Path, min_chars: int = 20) -> Iterator[Record]:
    """Records from the English fortune files of ``fortunes``, one per entry, in file order."""
    for path in fortune_files(root, "fortunes"):
        for k, text in fortune_entries(path):
            if len(text) < min_chars:
                continue
            yield {
                "id": f"fortunes-en/{path.name}/{k:05d}",
                "text": text,
                "source": "fortunes-en",
                "url": f"fortune://{path.name}/{k}",
                "lang": "en",
                "meta": meta(_attribution(text), path.name, "fortunes"),
            }


def _dedup_key(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def anarchism_records(root: Path, min_chars: int = OUTSIDE_MIN_CHARS,
                      max_chars: int = OUTSIDE_MAX_CHARS) -> Iterator[Record]:
    """The held-out set from ``fortune-anarchism``: entries of ``min_chars``-``max_chars``
    characters, exact duplicates (same words, case and punctuation aside) dropped, ordered by
    content hash so that any first N records are a spread sample of the whole file."""
    kept: dict[str, Record] = {}
    for path in fortune_files(root, "fortune-anarchism"):
        for k, text in fortune_entries(path):
            key = _dedup_key(text)
            if not min_chars <= len(text) <= max_chars or key in kept:
                continue
            kept[key] = {
                "id": f"anarchism/{path.name}/{k:05d}",
                "text": text,
                "source": "anarchism",
                "url": f"fortune://{path.name}/{k}",
                "lang": "en",
                "domain": "outside",
                "meta": meta(_attribution(text), path.name, "fortune-anarchism"),
            }
    yield from sorted(kept.values(), key=lambda r: (content_hash(r["text"], 16), r["id"]))


OUTSIDE_SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("fortunes-en", "fortunes", "en", fortunes_en_records, min_chars=20, merges=False),
    Source("anarchism", "fortune-anarchism", "en", anarchism_records, min_chars=OUTSIDE_MIN_CHARS, merges=False),
]}
