"""The manpages-zh source: Chinese (zh_CN) manual pages (``manpages-zh``), rendered by groff when
it is installed and by a small roff reader otherwise; one record per section."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import (
    Chunk,
    clean_text,
    display_width,
    join_cjk,
    line_joiner,
    merge_short,
    meta,
)

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
                text = text + line_joiner(text, piece) + piece if text else piece
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
