"""The debian-reference-zh source: the Debian Reference, Simplified Chinese, plain-text edition
(``debian-reference-zh-cn``), one record per numbered section."""

from __future__ import annotations

import gzip
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import (
    Chunk,
    IdMaker,
    clean_text,
    merge_short,
    meta,
    unwrap,
)

_DR_HEADING = re.compile(r"^(?:(?:\d+|[A-Z])(?:\.\d+)*\.)\s+\S")
_DR_CHAPTER = re.compile(r"^(?:第\s*(\d+)\s*章|附录\s*([A-Z])\.|Chapter\s+(\d+)\.|Appendix\s+([A-Z])\.)\s")
_DR_UNNUMBERED = {"序言": "preface", "摘要": "abstract", "Preface": "preface", "Abstract": "abstract"}


def _book_heading(line: str) -> tuple[str, str] | None:
    """``(anchor, kind)`` when ``line`` is a heading of the plain-text book, else None."""
    if not line or line[0].isspace():
        return None
    m = _DR_CHAPTER.match(line)
    if m:
        return next(g for g in m.groups() if g), "chapter"
    if _DR_HEADING.match(line):
        return line.split(None, 1)[0].rstrip("."), "number"
    if line.strip() in _DR_UNNUMBERED:
        return _DR_UNNUMBERED[line.strip()], "named"
    return None


def _drop_contents(lines: list[str]) -> list[str]:
    """Remove every table of contents: from a ``目录``/``Contents`` line up to where its
    first entry appears again (as the heading of the text that follows)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() in ("目录", "Table of Contents", "Contents") and not lines[i][:1].isspace():
            first = next((ln for ln in lines[i + 1:] if ln.strip() and not ln[0].isspace()), None)
            if first is not None:
                k = lines.index(first, i + 1)
                j = next((j for j in range(k + 1, len(lines)) if lines[j] == first), None)
                if j is not None:
                    i = j
                    continue
        out.append(lines[i])
        i += 1
    return out


def split_numbered_book(text: str) -> list[Chunk]:
    """Split a plain-text book at its numbered headings (``1.2.3. 标题`` at column 0).

    Tables of contents are skipped (:func:`_drop_contents`); the numbered parts of the
    unnumbered front matter (序言) get its anchor as prefix (``preface/2``), so ids stay
    unique when the chapters restart at 1. Hard-wrapped prose is unwrapped (:func:`unwrap`).
    """
    lines = _drop_contents(text.replace("\xa0", " ").splitlines())  # NBSPs indent the text edition
    chunks: list[Chunk] = []
    title, number, body = "", "title", []

    def flush() -> None:
        block = unwrap("\n".join(body))
        block = textwrap.dedent(block)
        txt = clean_text((title + "\n\n" + block) if title else block)
        if block.strip():
            chunks.append(Chunk(number, title, txt))

    in_front = True  # before the first chapter, numbered sections belong to the preface
    for line in lines:
        h = _book_heading(line)
        if h is None:
            body.append(line)
            continue
        flush()
        title, body = line.strip(), []
        number, kind = h
        if kind == "chapter":
            in_front = False
        elif kind == "number" and in_front:
            number = f"preface/{number}"
    flush()
    return chunks


def debian_reference_zh_records(root: Path, min_chars: int = 200) -> Iterator[Record]:
    """Records from ``debian-reference.zh-cn.txt.gz``, one per numbered section."""
    path = root / "usr/share/debian-reference/debian-reference.zh-cn.txt.gz"
    if not path.exists():
        raise CptkitError(f"{path}: not found in the unpacked debian-reference-zh-cn package")
    text = gzip.open(path).read().decode("utf-8", errors="replace")
    ids = IdMaker()
    for c in merge_short(split_numbered_book(text), min_chars):
        yield {
            "id": ids(f"debian-reference-zh/{c.anchor}"),
            "text": c.text,
            "source": "debian-reference-zh",
            "url": "https://www.debian.org/doc/manuals/debian-reference/index.zh-cn.html",
            "lang": "zh",
            "meta": meta("Debian 参考手册", c.title, "debian-reference-zh-cn"),
        }
