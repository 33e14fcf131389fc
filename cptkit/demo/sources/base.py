"""What every demo corpus source shares: its Debian package (``apt-get download`` into a cache,
unpacked with ``dpkg -x``: no root, nothing installed), the text helpers its parser uses (CJK,
ANSI, unwrapping, slugs, hashes) and the record building (chunks merged or split, unique ids,
``meta``). Only :func:`fetch_deb` and :func:`extract_deb` touch the system."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.text.tokenize import CJK_TEXT_CLASS, HAN_UNIFIED

DEFAULT_CACHE = "~/.cache/cptkit/debs"
CACHE_ENV = "CPTKIT_DEB_CACHE"


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


def line_joiner(prev: str, nxt: str) -> str:
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
            out[-1] = out[-1].rstrip() + line_joiner(out[-1].rstrip(), stripped) + stripped
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



@dataclass(frozen=True)
class Source:
    name: str
    package: str
    lang: str
    parse: Callable[..., Iterator[Record]]
    min_chars: int = 200
    merges: bool = True  # corpus.min_chars applies (fortunes keep their own small minimum)



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
