"""The demo corpus: real English and Chinese documentation text from Debian packages.

Each source is one Debian documentation package, fetched with ``apt-get download`` into a
cache directory and unpacked with ``dpkg -x`` (no root, nothing installed). A parser turns
the package's files into records ``{id, text, source, url, lang, meta}`` in a fixed order:

===================  =======================  ====  =========================================
source               package                  lang  unit
===================  =======================  ====  =========================================
python-docs          python3.11-doc           en    reST section or top-level object
maxima-docs          maxima-doc               en    HTML section or function definition
gcide                dict-gcide               en    dictionary entry (short ones merged)
manpages-zh          manpages-zh              zh    man page section (zh_CN)
debian-reference-zh  debian-reference-zh-cn   zh    numbered section of the plain-text book
fortunes-zh          fortunes-zh              zh    one fortune (poems, quotes)
===================  =======================  ====  =========================================

The text transformations are pure functions of strings (tested directly); only
:func:`fetch_deb`, :func:`extract_deb` and :func:`render_man` touch the system.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.text.tokenize import CJK_TEXT_CLASS, HAN_UNIFIED

DEFAULT_CACHE = "~/.cache/cptkit/debs"
CACHE_ENV = "CPTKIT_DEB_CACHE"


# --------------------------------------------------------------------------------------------
# Generic helpers
# --------------------------------------------------------------------------------------------

_CJK = re.compile(f"[{CJK_TEXT_CLASS}]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\[[0-9;]*m")


_CJK_GAP = re.compile(f"(?<=[{HAN_UNIFIED}，。、；：？！）」』]) (?=[{HAN_UNIFIED}，。、；：？！（「『])")


def join_cjk(text: str) -> str:
    """Drop single spaces between two Chinese characters (left by line breaks in sources)."""
    return _CJK_GAP.sub("", text)


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def cjk_share(text: str) -> float:
    """Share of CJK characters among the letters of ``text`` (0 when it has none)."""
    letters = sum(1 for c in text if c.isalpha())
    return len(_CJK.findall(text)) / letters if letters else 0.0


def display_width(line: str) -> int:
    """Terminal columns of ``line`` (East Asian wide characters count 2)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def strip_ansi(text: str) -> str:
    """Remove ANSI colour/escape sequences (also the ``[32m`` left when ESC was lost)."""
    return _ANSI.sub("", text)


def clean_text(text: str) -> str:
    """Strip trailing spaces, drop control characters, collapse 3+ newlines into 2."""
    text = "".join(c for c in text if c in "\n\t" or unicodedata.category(c) != "Cc")
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def slugify(title: str) -> str:
    """A docutils-style id for a section title: ``File Names, ...`` → ``file-names-...``."""
    s = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode().lower()
    s = re.sub(r"[^a-z0-9]+", "-", s)
    s = re.sub(r"^[-0-9]+|-+$", "", s)
    return s


def content_hash(text: str, n: int = 12) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def _joiner(prev: str, nxt: str) -> str:
    if not prev or not nxt:
        return ""
    return "" if (has_cjk(prev[-1]) or has_cjk(nxt[0])) else " "


_CODEISH = re.compile(r"^\s*([#$%>|+]|\* |- |\d+\. |[A-Za-z]\. |…|\.\.\.)")


def unwrap(text: str, min_width: int = 60) -> str:
    """Join hard-wrapped prose lines (as in a text rendering of a book) into paragraphs.

    A line is joined to the previous one when the previous line was long (at least
    ``min_width`` columns, i.e. it was wrapped), both have the same indentation (or the
    previous one opened a ``* `` bullet) and the line does not look like code or a new item.
    Chinese lines are joined without a space.
    """
    out: list[str] = []
    cont_indent: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        ind = len(line) - len(line.lstrip(" "))
        if (out and stripped and cont_indent is not None and ind == cont_indent
                and display_width(out[-1]) >= min_width and not _CODEISH.match(line)
                and not out[-1].lstrip().startswith(("#", "$"))):
            out[-1] = out[-1].rstrip() + _joiner(out[-1].rstrip(), stripped) + stripped
            continue
        out.append(line)
        if not stripped:
            cont_indent = None
        else:
            m = re.match(r"^(\s*)(\* |- )", line)
            cont_indent = len(m.group(0)) if m else ind
    return "\n".join(out)


def meta(title: str, section: str, package: str) -> dict[str, str]:
    """The ``meta`` of every demo-corpus record: the same string fields for all sources, so
    the shards load as one table (``datasets.load_dataset("json", ...)``)."""
    return {"title": title, "section": section, "package": package}


@dataclass
class Chunk:
    """A piece of a document before it becomes a record: anchor, title and text."""

    anchor: str
    title: str
    text: str


def merge_short(chunks: list[Chunk], min_chars: int) -> list[Chunk]:
    """Append chunks shorter than ``min_chars`` to the previous chunk (the first to the next).

    The merged chunk keeps the anchor of the longer-lived one, so ids stay stable. A single
    chunk shorter than ``min_chars`` with nothing to merge into is dropped.
    """
    out: list[Chunk] = []
    carry: Chunk | None = None
    for c in chunks:
        if carry is not None:
            c = Chunk(carry.anchor, carry.title, carry.text + "\n\n" + c.text)
            carry = None
        if len(c.text) >= min_chars:
            out.append(c)
        elif out:
            out[-1] = Chunk(out[-1].anchor, out[-1].title, out[-1].text + "\n\n" + c.text)
        else:
            carry = c
    return out


def split_long(text: str, max_chars: int) -> list[str]:
    """Split ``text`` at paragraph breaks into parts of at most ~``max_chars`` characters."""
    if max_chars <= 0 or len(text) <= max_chars:
        return [text]
    parts: list[str] = []
    cur = ""
    for para in re.split(r"\n{2,}", text):
        while len(para) > max_chars:  # one huge paragraph: cut at a line break if possible
            cut = para.rfind("\n", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            if cur:
                parts.append(cur)
                cur = ""
            parts.append(para[:cut].rstrip())
            para = para[cut:].lstrip("\n")
        if cur and len(cur) + 2 + len(para) > max_chars:
            parts.append(cur)
            cur = para
        else:
            cur = cur + "\n\n" + para if cur else para
    if cur:
        parts.append(cur)
    return [p for p in parts if p.strip()]


class IdMaker:
    """Makes ids unique by adding ``~2``, ``~3``... to repeats (in encounter order)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, rid: str) -> str:
        n = self.seen.get(rid, 0) + 1
        self.seen[rid] = n
        if n == 1:
            return rid
        new = f"{rid}~{n}"
        while new in self.seen:
            n += 1
            new = f"{rid}~{n}"
        self.seen[rid] = n
        self.seen[new] = 1
        return new


# --------------------------------------------------------------------------------------------
# python-docs: reStructuredText sources of the Python 3.11 documentation
# --------------------------------------------------------------------------------------------

_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")
_OBJECT_DIRECTIVES = {
    "function", "class", "method", "data", "exception", "attribute", "decorator",
    "decoratormethod", "classmethod", "staticmethod", "abstractmethod", "coroutinefunction",
    "coroutinemethod", "opcode", "envvar", "cmdoption", "option", "describe", "pdbcommand",
    "c:function", "c:macro", "c:type", "c:member", "c:var", "c:struct",
    "py:function", "py:class", "py:method", "py:data", "py:attribute", "py:exception",
}
_DROP_BLOCKS = {"index", "toctree", "testsetup", "testcleanup", "raw", "include", "only-html",
                "sectionauthor", "moduleauthor", "highlight", "literalinclude", "image", "figure",
                "productionlist", "tabularcolumns", "audit-event-table", "cssclass", "rst-class",
                "limited-api-list"}
_ADMONITIONS = {"note": "Note:", "warning": "Warning:", "seealso": "See also:", "tip": "Tip:",
                "important": "Important:", "caution": "Caution:", "attention": "Attention:",
                "impl-detail": "CPython implementation detail:", "hint": "Hint:", "danger": "Danger:"}
_VERSION_NOTES = {"versionadded": "New in version {}.", "versionchanged": "Changed in version {}.",
                  "deprecated": "Deprecated since version {}.",
                  "deprecated-removed": "Deprecated since version {}."}
_CODE_ROLES = {"func", "meth", "class", "mod", "attr", "data", "exc", "const", "obj", "envvar",
               "option", "file", "samp", "program", "keyword", "makevar", "opcode", "c", "py",
               "cmdoption", "code", "kbd", "mailheader", "mimetype", "macro", "expr", "type",
               "member", "var", "struct", "pdbcmd", "monitoring-event", "token", "gh", "issue",
               "source", "newsgroup", "command", "magic"}
_ROLE = re.compile(r":(?:[\w-]+:)*([\w-]+):`([^`]+)`")


def _role_text(m: re.Match) -> str:
    role, body = m.group(1), m.group(2)
    tm = re.match(r"^(.*?)\s*<([^>]+)>$", body, re.S)
    if tm and tm.group(1):
        body = tm.group(1)
    elif tm:
        body = tm.group(2)
    body = body.lstrip("!")
    if body.startswith("~"):
        body = body[1:].rsplit(".", 1)[-1]
    if role == "pep":
        return f"PEP {body}"
    if role == "rfc":
        return f"RFC {body}"
    if role in _CODE_ROLES:
        return f"`{body}`"
    return body


def rst_inline(text: str) -> str:
    """Resolve inline reST markup: roles, ``literals``, `links <url>`_, substitutions."""
    text = _ROLE.sub(_role_text, text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = re.sub(r"`([^`<]+?)\s*<[^>]+>`__?", r"\1", text)
    text = re.sub(r"`([^`]+)`__?(?=\W|$)", r"\1", text)
    text = text.replace("\\ ", "")
    text = text.replace("\\*", "*").replace("\\_", "_").replace("\\`", "`")
    return text


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_end(lines: list[str], i: int, base: int) -> int:
    """Index after the indented body of the directive at line ``i`` (indentation ``base``)."""
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
        j += 1
    return j


def _py_anchor(kind: str, sig: str, module: str) -> tuple[str, str]:
    """Sphinx html id and short name of an object directive's first signature."""
    kind = kind.split(":")[-1] if kind.startswith("py:") else kind
    name = re.split(r"[\s(\[]", sig.strip(), maxsplit=1)[0].rstrip(":")
    if kind == "envvar":
        return f"envvar-{name}", name
    if kind == "opcode":
        return f"opcode-{name}", name
    if kind.startswith("c:"):
        cname = re.findall(r"[A-Za-z_]\w*(?=\s*(?:\(|$|\[))", sig) or [name]
        return f"c.{cname[0]}", cname[0]
    if kind in ("cmdoption", "option", "describe", "pdbcommand"):
        return slugify(f"{kind}-{name}") or content_hash(sig), name
    full = f"{module}.{name}" if module and not name.startswith(module + ".") else name
    return full, full


def _directive_head(lines: list[str], i: int, end: int, kind: str, arg: str) -> tuple[list[str], int]:
    """The signatures of the directive at line ``i`` (an object's extra signatures continue at
    its argument's column) and the first line after them and its options."""
    j = i + 1
    sigs = [arg]
    if kind in _OBJECT_DIRECTIVES and arg:
        col = lines[i].index(arg)
        while j < end and lines[j].strip() and _indent(lines[j]) == col and not lines[j].lstrip().startswith(":"):
            sigs.append(lines[j].strip())
            j += 1
    while j < end and lines[j].strip() and re.match(r"^\s+:[\w-]+:", lines[j]):
        j += 1  # options (":noindex:", ":synopsis: ...")
    return sigs, j


def _directive_text(kind: str, arg: str, sigs: list[str], pad: str) -> list[str]:
    """The plain-text lines a (non top-level object) directive's markup renders to; every other
    directive (code-block, doctest, only, ...) renders to nothing, its body is kept."""
    if kind in _ADMONITIONS:
        label = _ADMONITIONS[kind]
        return [pad + (f"{label} {arg}" if arg else label)]
    if kind in _VERSION_NOTES:
        parts = arg.split(None, 1)
        note = _VERSION_NOTES[kind].format(parts[0] if parts else "")
        return [pad + note + (" " + parts[1] if len(parts) > 1 else "")]
    if kind in _OBJECT_DIRECTIVES:  # a nested object (a method in a class)
        return [pad + sig for sig in sigs]
    if kind in ("rubric", "topic", "sidebar", "centered", "table", "csv-table", "list-table") and arg:
        return [pad + arg]
    if kind == "availability":
        return [pad + f"Availability: {arg}"]
    return []


def split_rst(text: str, page: str) -> list[Chunk]:
    """Split a reST page into chunks at section titles and at top-level object directives.

    Directive markup is rendered as plain text (admonition labels, version notes, code kept,
    index/toctree/label noise dropped); each chunk's anchor is the id Sphinx gives it in HTML.
    """
    lines = text.replace("\t", "    ").splitlines()
    chunks: list[Chunk] = []
    cur_anchor, cur_title, buf = "", page, []
    module, seen_title = "", False
    head = 0  # leading lines of buf not to dedent (title, signatures)
    i, n = 0, len(lines)

    def flush() -> None:
        nonlocal head
        raw = "\n".join(buf[:head]) + "\n" + textwrap.dedent("\n".join(buf[head:]))
        body = clean_text(rst_inline(raw))
        if body.strip():
            chunks.append(Chunk(cur_anchor, cur_title, body))
        buf.clear()
        head = 0

    while i < n:
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < n else ""
        # section title (optionally overlined)
        if (line.strip() and not line.startswith(" ") and _UNDERLINE.match(nxt)
                and len(nxt.strip()) >= len(line.rstrip()) - 1 and not _UNDERLINE.match(line)):
            flush()
            title = rst_inline(line.strip())
            cur_title = title
            cur_anchor = slugify(title) if seen_title else ""
            seen_title = True
            buf.append(title)
            head = 1
            i += 2
            continue
        if _UNDERLINE.match(line) and not line.startswith(" ") and not nxt.strip() \
                and (i == 0 or not lines[i - 1].strip()):
            i += 1  # a transition line
            continue
        if _UNDERLINE.match(line) and i + 2 < n and _UNDERLINE.match(lines[i + 2]) and nxt.strip():
            i += 1  # an overline: the title itself is handled on the next line
            continue
        m = _DIRECTIVE.match(line)
        if m:
            ind, kind, arg = len(m.group(1)), m.group(2), m.group(3).strip()
            end = _block_end(lines, i, ind)
            sigs, j = _directive_head(lines, i, end, kind, arg)
            if kind in ("module", "currentmodule", "py:module", "py:currentmodule"):
                module = "" if arg == "None" else arg
                i = end
                continue
            if kind in _DROP_BLOCKS:
                i = end
                continue
            pad = " " * ind
            if kind in _OBJECT_DIRECTIVES and ind == 0:
                flush()
                cur_anchor, cur_title = _py_anchor(kind, arg, module)
                buf.extend(sigs)
                head = len(sigs)
            else:
                buf.extend(_directive_text(kind, arg, sigs, pad))
            buf.append("")
            i = j  # the body is processed in place (nested directives included)
            continue
        if re.match(r"^\s*\.\.\s+_[^:]+:\s*$", line) or re.match(r"^\s*\.\.\s+\|[^|]+\|", line):
            i += 1
            continue
        if re.match(r"^\s*\.\.(\s|$)", line):  # a comment and its indented body
            i = _block_end(lines, i, _indent(line))
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            stripped = line.rstrip()[:-2].rstrip()
            line = (stripped + ":") if stripped else ""
        buf.append(line)
        i += 1
    flush()
    return chunks


def python_docs_records(root: Path, min_chars: int = 200) -> Iterator[Record]:
    """Records from ``usr/share/doc/python3.11/html/_sources/**/*.rst.txt``, sorted by page."""
    base = root / "usr/share/doc/python3.11/html/_sources"
    if not base.is_dir():
        raise CptkitError(f"{base}: not found in the unpacked python3.11-doc package")
    for path in sorted(base.rglob("*.rst.txt")):
        page = path.relative_to(base).as_posix()[: -len(".rst.txt")]
        chunks = merge_short(split_rst(path.read_text(encoding="utf-8", errors="replace"), page), min_chars)
        page_title = chunks[0].title if chunks else page
        for c in chunks:
            anchor = f"#{c.anchor}" if c.anchor else ""
            yield {
                "id": f"python-docs/{page}{anchor}",
                "text": c.text,
                "source": "python-docs",
                "url": f"https://docs.python.org/3.11/{page}.html{anchor}",
                "lang": "en",
                "meta": meta(page_title, c.title, "python3.11-doc"),
            }


# --------------------------------------------------------------------------------------------
# maxima-docs: Texinfo HTML of the Maxima manual
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# gcide: the Collaborative International Dictionary of English in dictd format
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# manpages-zh: Chinese (zh_CN) manual pages
# --------------------------------------------------------------------------------------------

_ROFF_ESCAPES = {
    "(em": "—", "(en": "–", "(lq": "“", "(rq": "”", "(oq": "‘", "(cq": "’", "(aq": "'", "(dq": '"',
    "(co": "©", "(rg": "®", "(bu": "•", "(mu": "×", "(de": "°", "(+-": "±", "(<=": "≤", "(>=": "≥",
    "(!=": "≠", "(->": "→", "(<-": "←", "(ti": "~", "(ha": "^", "(hy": "-", "(rs": "\\",
    "(ga": "`", "(sl": "/", "(ba": "|", "(br": "│", "(ul": "_", "(Fo": "«", "(Fc": "»",
    "*(lq": "“", "*(rq": "”", "*(Tm": "™", "*R": "®",
}
_FONT_MACROS = {"B", "I", "R", "SM", "SB", "BR", "BI", "IB", "IR", "RB", "RI"}


def roff_inline(s: str) -> str:
    """Resolve roff escapes in a line of text (fonts dropped, special characters mapped)."""
    s = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", s)
    s = re.sub(r"\\s[+-]?\d", "", s)
    s = re.sub(r"\\\*(\(..|\[[^\]]*\]|.)", lambda m: _ROFF_ESCAPES.get("*" + m.group(1), ""), s)
    s = re.sub(r"\\(\(..)", lambda m: _ROFF_ESCAPES.get(m.group(1), ""), s)
    s = re.sub(r"\\\[([^\]]*)\]", lambda m: _ROFF_ESCAPES.get("(" + m.group(1), ""), s)
    s = re.sub(r"\\[nk](\(..|\[[^\]]*\]|.)", "", s)
    s = re.sub(r"\\[hvwlLoxbDZ]'[^']*'", "", s)
    s = s.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ").replace("\\0", " ")
    s = re.sub(r"\\[&|^%,/:c)!]", "", s)
    s = s.replace("\\.", ".").replace("\\'", "'").replace("\\`", "`").replace('\\"', "")
    return s


def _macro_args(rest: str) -> list[str]:
    args, cur, quoted, i = [], "", False, 0
    while i < len(rest):
        ch = rest[i]
        if ch == '"':
            if quoted and i + 1 < len(rest) and rest[i + 1] == '"':
                cur += '"'
                i += 2
                continue
            quoted = not quoted
        elif ch in " \t" and not quoted:
            if cur:
                args.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    if cur:
        args.append(cur)
    return args


class _Roff:
    """The state of :func:`strip_roff`: output lines, the paragraph being filled, indent and modes."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.para: list[str] = []
        self.indent, self.nofill, self.tag_next = 7, False, False

    def flush(self) -> None:
        if self.para:
            text = ""
            for piece in self.para:
                text = text + _joiner(text, piece) + piece if text else piece
            self.out.append(" " * self.indent + text)
            self.para.clear()

    def emit(self, text: str) -> None:
        text = roff_inline(text)
        if self.tag_next:
            self.flush()
            self.out.append(" " * self.indent + text.strip())
            self.tag_next = False
            return
        if self.nofill:
            self.out.append(" " * self.indent + text)
        elif text.strip():
            self.para.append(text.strip())

    def request(self, name: str, rest: str) -> None:
        """One macro line ``.NAME REST``; any other request (.de .if .ds .ad .na .ne .in .ti .so
        ...) and ``.TH`` are dropped."""
        if name in ("SH", "SS"):
            self.flush()
            self.out.append("")
            self.out.append(("" if name == "SH" else "   ") + roff_inline(" ".join(_macro_args(rest))))
            self.indent = 7
        elif name in ("PP", "P", "LP", "sp", "HP", "TP", "IP"):
            self.flush()
            self.out.append("")
            self.tag_next = self.tag_next or name == "TP"
            args = _macro_args(rest) if name == "IP" else []
            if args:
                self.out.append(" " * self.indent + roff_inline(args[0]))
        elif name in ("br", "TS", "TE", "T&"):
            self.flush()
        elif name in ("nf", "EX"):
            self.flush()
            self.nofill = True
        elif name in ("fi", "EE"):
            self.nofill = False
        elif name in ("RS", "RE"):
            self.flush()
            self.indent = self.indent + 4 if name == "RS" else max(7, self.indent - 4)
        elif name in _FONT_MACROS:
            args = _macro_args(rest)
            self.emit("".join(args) if len(name) == 2 and name not in ("SM", "SB") else " ".join(args))
        elif name in ("UR", "MT"):
            self.emit(rest)


def strip_roff(src: str) -> str:
    """Render man(7) source to plain text without groff: a careful macro stripper.

    Handles the man macros (``.TH .SH .SS .PP .TP .IP .B .I .BR ... .nf .fi .RS .RE``),
    comments and the common escapes; tables (``.TS``) keep their cell text. Section
    headings come out at column 0 and body text indented by 7, like ``man`` output.
    """
    r = _Roff()
    for raw in src.splitlines():
        line = raw.rstrip()
        if line.startswith(".\\\"") or line.startswith("'\\\"") or line.startswith('\\"') or line == ".":
            continue
        if line.startswith((".", "'")) and len(line) > 1:
            m = re.match(r"^[.'](\S+)\s*(.*)$", line)
            if m:
                r.request(m.group(1), m.group(2))
            continue
        r.emit(line if r.nofill or r.tag_next else line.replace("\t", " "))
    r.flush()
    # tables: tab-separated cells and format lines ("l l." / "lb lb.") dropped
    text = "\n".join(ln for ln in r.out if not re.match(r"^\s*[lcrnaLCRNA][lcrnabiLCRNABI0-9 |]*\.\s*$", ln))
    return clean_text(text.replace("\t", "  "))


def man_available() -> bool:
    return shutil.which("man") is not None and shutil.which("groff") is not None \
        or shutil.which("man") is not None and shutil.which("nroff") is not None


_MANWIDTH = 1000  # wide enough that groff never wraps or justifies a normal paragraph


def render_man(path: Path) -> str:
    """Render a man page with ``man -l`` and ``col -bx`` (no line wrapping, no justification)."""
    env = {**os.environ, "MANWIDTH": str(_MANWIDTH), "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8",
           "MAN_DISABLE_SECCOMP": "1", "MANROFFOPT": "-c"}
    man = subprocess.run(["man", "-l", str(path)], env=env, capture_output=True, check=False)
    if man.returncode != 0 or not man.stdout.strip():
        raise CptkitError(f"{path}: man -l failed: {man.stderr.decode(errors='replace').strip()[:200]}")
    col = subprocess.run(["col", "-bx"], input=man.stdout, env=env, capture_output=True, check=True)
    lines = col.stdout.decode("utf-8", errors="replace").splitlines()
    # drop the header line ("LS(1)  用户命令  LS(1)") and the footer (last non-blank line)
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines:
        lines.pop(0)
    while lines and (not lines[-1].strip() or re.search(r"\S {10,}\S|^ {30,}\S", lines[-1])):
        lines.pop()  # the footer ("1995年3月30日   LS(1)", centred at MANWIDTH)
    # groff cannot break Chinese text, so an over-long line is filled to MANWIDTH by
    # stretching its spaces: undo that justification on lines that reach the full width
    out = []
    for line in lines:
        if display_width(line) >= _MANWIDTH - 40:
            ind = len(line) - len(line.lstrip(" "))
            line = " " * ind + re.sub(r" {2,}", " ", line.strip())
        out.append(line)
    return clean_text("\n".join(out))


def split_man(text: str) -> list[Chunk]:
    """Split rendered man text at section headings (lines at column 0)."""
    chunks: list[Chunk] = []
    title, body = "", []
    for line in text.splitlines():
        if line.strip() and not line[0].isspace():
            if body and "".join(body).strip():
                chunks.append(Chunk(title, title, clean_text(title + "\n" + textwrap.dedent("\n".join(body)))))
            title, body = re.sub(r"\s+", " ", line.strip()), []
        else:
            body.append(line)
    if body and "".join(body).strip():
        chunks.append(Chunk(title, title, clean_text(title + "\n" + textwrap.dedent("\n".join(body)))))
    return chunks


def read_man_source(path: Path) -> str:
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    for enc in ("utf-8", "gb18030"):
        try:
            return raw.decode(enc)
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", errors="replace")


def manpages_zh_records(root: Path, min_chars: int = 200, renderer: str = "auto") -> Iterator[Record]:
    """Records from the zh_CN man pages, one per section (short sections merged)."""
    base = root / "usr/share/man/zh_CN"
    if not base.is_dir():
        raise CptkitError(f"{base}: not found in the unpacked manpages-zh package")
    if renderer not in ("auto", "man", "strip"):
        raise CptkitError(f"corpus.man_renderer must be auto, man or strip, got {renderer!r}")
    use_man = renderer == "man" or (renderer == "auto" and man_available())
    if renderer == "man" and not man_available():
        raise CptkitError("corpus.man_renderer=man but man-db/groff are not installed")
    files = sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink())
    for path in files:
        src = read_man_source(path)
        if re.match(r"^\.so\s", src.lstrip()):
            continue
        name = path.name[:-3] if path.name.endswith(".gz") else path.name  # ls.1
        text = join_cjk(render_man(path) if use_man else strip_roff(src))
        page, _, sect = name.rpartition(".")
        for c in merge_short(split_man(text), min_chars):
            yield {
                "id": f"manpages-zh/{name}#{c.anchor}" if c.anchor else f"manpages-zh/{name}",
                "text": c.text,
                "source": "manpages-zh",
                "url": f"https://manpages.debian.org/bookworm/manpages-zh/{name}.zh_CN.html",
                "lang": "zh",
                "meta": meta(f"{page}({sect})", c.title, "manpages-zh"),
            }


# --------------------------------------------------------------------------------------------
# debian-reference-zh: the Debian Reference, Simplified Chinese, plain-text edition
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# fortunes-zh: strfile text files, entries separated by "%" lines
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Sources, fetching, extraction
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    name: str
    package: str
    lang: str
    parse: Callable[..., Iterator[Record]]
    min_chars: int = 200
    merges: bool = True  # corpus.min_chars applies (fortunes keep their own small minimum)


SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("python-docs", "python3.11-doc", "en", python_docs_records),
    Source("maxima-docs", "maxima-doc", "en", maxima_docs_records),
    Source("gcide", "dict-gcide", "en", gcide_records),
    Source("manpages-zh", "manpages-zh", "zh", manpages_zh_records),
    Source("debian-reference-zh", "debian-reference-zh-cn", "zh", debian_reference_zh_records),
    Source("fortunes-zh", "fortunes-zh", "zh", fortunes_zh_records, min_chars=10, merges=False),
]}


def cache_dir(configured: str | None = None) -> Path:
    """The .deb cache: the configured path, else ``$CPTKIT_DEB_CACHE``, else ~/.cache/cptkit/debs."""
    path = configured or os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(os.path.expanduser(path))


def fetch_deb(package: str, cache: Path) -> Path:
    """The cached ``<package>_*.deb`` (newest by name), downloading it with apt-get if missing."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    if shutil.which("apt-get") is None:
        raise CptkitError(f"{package}: not in {cache} and apt-get is not available to download it")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        r = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, check=False)
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if r.returncode != 0 or not debs:
            msg = r.stderr.decode(errors="replace").strip().splitlines()
            raise CptkitError(f"apt-get download {package} failed: {msg[-1] if msg else r.returncode} "
                              f"(run 'apt-get update', or put {package}_*.deb into {cache})")
        final = cache / debs[0].name
        os.replace(debs[0], final)
    return final


def deb_version(deb: Path) -> str:
    """The version in a ``<package>_<version>_<arch>.deb`` file name (``%3a`` is the epoch's ``:``;
    ``""`` for a file named otherwise)."""
    parts = deb.name.removesuffix(".deb").split("_")
    return urllib.parse.unquote(parts[1]) if len(parts) == 3 else ""


def extract_deb(deb: Path, cache: Path) -> Path:
    """Unpack ``deb`` with ``dpkg -x`` into ``cache/extracted/<name>`` once (atomic rename)."""
    dest = cache / "extracted" / deb.name[: -len(".deb")]
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("dpkg") is None:
        raise CptkitError(f"{deb}: dpkg is not available to unpack it")
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    r = subprocess.run(["dpkg", "-x", str(deb), str(tmp)], capture_output=True, check=False)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CptkitError(f"{deb}: dpkg -x failed: {r.stderr.decode(errors='replace').strip()[:200]}")
    try:
        os.rename(tmp, dest)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def source_records(name: str, root: Path, *, min_chars: int | None = None, max_chars: int = 0,
                   man_renderer: str = "auto", sources: dict[str, Source] | None = None) -> Iterator[Record]:
    """The records of source ``name`` (of ``sources``, default :data:`SOURCES`) from its unpacked
    package at ``root``, ids unique.

    A record of a Chinese source with (almost) no Chinese in it gets ``lang: en``.
    Documents longer than ``max_chars`` are split at paragraph breaks into ``<id>~pN`` parts.
    """
    sources = SOURCES if sources is None else sources
    if name not in sources:
        raise CptkitError(f"unknown corpus source {name!r}; known: {', '.join(sources)}")
    src = sources[name]
    mc = src.min_chars if min_chars is None or not src.merges else min_chars
    gen = src.parse(root, mc, renderer=man_renderer) if name == "manpages-zh" else src.parse(root, mc)
    seen: set[str] = set()
    for rec in gen:
        if src.lang == "zh" and cjk_share(rec["text"]) < 0.05:
            rec["lang"] = "en"  # an untranslated section of a Chinese man page
        parts = split_long(rec["text"], max_chars)
        for k, part in enumerate(parts, 1):
            r = dict(rec, text=part) if len(parts) == 1 else dict(rec, id=f"{rec['id']}~p{k}", text=part)
            if r["id"] in seen:
                r["id"] = f"{r['id']}~{content_hash(part, 8)}"
            seen.add(r["id"])
            yield r
