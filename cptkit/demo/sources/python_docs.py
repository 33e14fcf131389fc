"""The python-docs source: reStructuredText sources of the Python 3.11 documentation
(``python3.11-doc``), one record per section or top-level object."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import (
    Chunk,
    clean_text,
    content_hash,
    merge_short,
    meta,
    slugify,
)

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
