"""The maxima-docs source: the Texinfo HTML of the Maxima manual (``maxima-doc``), one record per
section or function definition."""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import (
    Chunk,
    clean_text,
    merge_short,
    meta,
)

_BLOCK_TAGS = {"p", "div", "br", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "li",
               "tr", "table", "dl", "ul", "ol", "blockquote", "hr"}
_SKIP_CLASSES = {"header", "categorybox", "menu", "copiable-anchor", "nav-panel", "contents",
                 "shortcontents", "footnotes-segment"}


class _SectionHTML(HTMLParser):
    """HTML → text, cut into chunks at headings and at the first ``<dt>`` of a definition."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[Chunk] = []
        self.anchor, self.title = "", ""
        self.parts: list[str] = []
        self.skip_depth = 0
        self.stack: list[tuple[str, bool]] = []
        self.pre = 0
        self.last_id = ""
        self.in_heading: list[str] | None = None
        self.in_dt: list[str] | None = None
        self.dt_run = False
        self.ignore = 0  # inside <head>/<style>/<script>

    def _flush(self) -> None:
        text = clean_text("".join(self.parts))
        text = "\n".join(ln.strip() if not ln.startswith("    ") else ln for ln in text.splitlines())
        text = clean_text(text)
        if text:
            self.chunks.append(Chunk(self.anchor, self.title, text))
        self.parts = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("head", "style", "script"):
            self.ignore += 1
            return
        classes = set((a.get("class") or "").split())
        skip = bool(classes & _SKIP_CLASSES) or (tag == "table" and "menu" in classes)
        if tag not in ("br", "hr", "img", "meta", "link", "input"):
            self.stack.append((tag, skip))
        if skip:
            self.skip_depth += 1
        if a.get("id"):
            self.last_id = a["id"] or ""
        if self.skip_depth:
            return
        if tag in ("h1", "h2", "h3", "h4"):
            self._flush()
            self.anchor = self.last_id
            self.in_heading = []
            self.dt_run = False
        if tag == "dt":
            if not self.dt_run:
                self._flush()
                self.anchor = a.get("id") or self.last_id
                self.in_dt = []
            self.dt_run = True
        elif tag in ("dd", "p"):
            self.dt_run = False
        if tag == "pre":
            self.pre += 1
        if tag in _BLOCK_TAGS:
            self.parts.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4", "dl", "table",
                                                 "blockquote") else "\n")
        if tag == "li":
            self.parts.append("- ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("head", "style", "script"):
            self.ignore = max(0, self.ignore - 1)
            return
        # pop to the matching tag (HTML may omit end tags)
        for k in range(len(self.stack) - 1, -1, -1):
            if self.stack[k][0] == tag:
                for _, skipped in self.stack[k:]:
                    if skipped:
                        self.skip_depth -= 1
                del self.stack[k:]
                break
        if self.skip_depth:
            return
        if tag in ("h1", "h2", "h3", "h4") and self.in_heading is not None:
            self.title = re.sub(r"\s+", " ", "".join(self.in_heading)).strip()
            self.in_heading = None
        if tag == "dt" and self.in_dt is not None:
            self.title = re.sub(r"\s+", " ", "".join(self.in_dt)).strip()
            self.in_dt = None
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.ignore or self.skip_depth:
            return
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
        else:
            data = textwrap.indent(data, "    ", lambda _ln: True)
        self.parts.append(data)
        if self.in_heading is not None:
            self.in_heading.append(data)
        if self.in_dt is not None:
            self.in_dt.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def split_html(text: str) -> tuple[str, list[Chunk]]:
    """Page title and chunks (anchor, title, text) of a Texinfo-generated HTML page."""
    m = re.search(r"<title>(.*?)</title>", text, re.S | re.I)
    title = html.unescape(m.group(1)).strip() if m else ""
    p = _SectionHTML()
    p.feed(text)
    p.close()
    return title, p.chunks


def _maxima_order(path: Path) -> tuple[int, str]:
    m = re.match(r"maxima_(\d+)\.html$", path.name)
    return (int(m.group(1)) if m else -1, path.name)


def maxima_docs_records(root: Path, min_chars: int = 200) -> Iterator[Record]:
    """Records from the Maxima manual's HTML pages (index and table-of-contents pages skipped)."""
    base = root / "usr/share/doc/maxima-doc/html"
    if not base.is_dir():
        raise CptkitError(f"{base}: not found in the unpacked maxima-doc package")
    pages = [p for p in base.glob("*.html") if re.match(r"(maxima_\d+|intromax)\.html$", p.name)]
    for path in sorted(pages, key=_maxima_order):
        title, chunks = split_html(path.read_text(encoding="utf-8", errors="replace"))
        title = re.sub(r"\s*\(Maxima [\d.]+ Manual\)$", "", title)
        if "Index" in title.split():
            continue
        for c in merge_short(chunks, min_chars):
            anchor = f"#{c.anchor}" if c.anchor else ""
            yield {
                "id": f"maxima-docs/{path.stem}{anchor}",
                "text": c.text,
                "source": "maxima-docs",
                "url": f"https://maxima.sourceforge.io/docs/manual/{path.name}{anchor}",
                "lang": "en",
                "meta": meta(title, c.title or title, "maxima-doc"),
            }
