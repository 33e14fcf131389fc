"""A corpus of ~1M+ real paragraphs for the scale benchmarks: every Debian documentation package,
dictionary and man-page package listed in ``PACKAGES`` (Debian 12 main), split into paragraphs.

Each package is fetched with ``apt-get download`` into the demo corpus's .deb cache and unpacked
with ``dpkg -x`` (cptkit.demo.corpus). Text comes from HTML (tags stripped at block boundaries), man
pages (roff stripped), dictd databases (one entry per paragraph), fortunes (``%`` separated) and
plain text files. Paragraphs are blank-line separated, whitespace-normalised and kept when they
have 80 to 4,000 characters (longer ones are cut at sentence ends). The paragraphs of all packages
are shuffled with a fixed seed, so the first ``n`` of the output are a mix of every source, and
written as shards of 50,000 records: ``{"id", "text", "source"}``.

    python bench/scale_corpus.py --out ~/.cache/cptkit/scale/paragraphs [--limit 1200000]

A second run with the same ``--limit``, ``--seed`` and packages keeps the corpus (``_built.json``).
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cptkit.demo.sources.base import cache_dir, extract_deb, fetch_deb  # noqa: E402
from cptkit.demo.sources.manpages_zh import strip_roff  # noqa: E402

PACKAGES = [
    "python3.11-doc", "maxima-doc", "octave-doc", "r-doc-html", "perl-doc", "ruby3.1-doc", "rust-doc",
    "openjdk-17-doc", "golang-1.19-doc", "erlang-doc", "nodejs-doc", "tcl8.6-doc", "bash-doc",
    "linux-doc-6.1", "libreoffice-help-en-us", "postgresql-doc-15", "sqlite3-doc", "git-doc", "glibc-doc",
    "gnu-standards", "debian-reference-en", "debian-reference-zh-cn", "debian-policy",
    "developers-reference", "debian-handbook", "manpages", "manpages-dev", "manpages-zh",
    "dict-gcide", "dict-wn", "dict-jargon", "dict-foldoc", "dict-vera", "dict-devil", "fortunes",
    "fortunes-zh",
]
MIN_CHARS, MAX_CHARS, SHARD = 80, 4000, 50_000
BLOCK = {"p", "div", "br", "li", "dt", "dd", "pre", "tr", "table", "h1", "h2", "h3", "h4", "h5", "h6",
         "section", "article", "blockquote", "ul", "ol", "dl", "hr", "header", "footer", "nav"}


class _Text(HTMLParser):
    """Visible text of an HTML page; a blank line at every block boundary; scripts/styles dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self.skip += 1
        elif tag in BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head"):
            self.skip = max(0, self.skip - 1)
        elif tag in BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_text(raw: str) -> str:
    p = _Text()
    p.feed(raw)
    return html.unescape("".join(p.parts))


def read(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix in (".gz", ".dz"):
        try:
            data = gzip.decompress(data)
        except OSError:
            return ""
    return data.decode("utf-8", errors="replace")


def file_text(path: Path) -> Iterator[str]:
    """The text blocks of one file, by kind (nothing for binaries and indexes)."""
    name, parts = path.name, path.parts
    if name.endswith((".html", ".htm", ".html.gz", ".xhtml")):
        yield html_text(read(path))
    elif "man" in parts and re.search(r"\.\d\w*(\.gz)?$", name):
        yield strip_roff(read(path))
    elif name.endswith(".dict.dz") or name.endswith(".dict"):
        yield read(path)
    elif "fortunes" in parts and not name.endswith((".dat", ".u8")) and "." not in name:
        yield read(path).replace("\n%\n", "\n\n")
    elif name.endswith((".txt", ".txt.gz", ".pod", ".rst", ".md")) or (name.isupper() and "." not in name):
        yield read(path)


def paragraphs(text: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", text):
        para = " ".join(block.split())
        while len(para) > MAX_CHARS:
            cut = para.rfind(". ", MIN_CHARS, MAX_CHARS)
            cut = cut + 1 if cut > 0 else MAX_CHARS
            yield para[:cut]
            para = para[cut:].strip()
        if len(para) >= MIN_CHARS:
            yield para


def package_paragraphs(package: str, cache: Path) -> Iterator[str]:
    root = extract_deb(fetch_deb(package, cache), cache)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        for text in file_text(path):
            yield from paragraphs(text)


def build(out: Path, limit: int, seed: int) -> dict[str, int]:
    cache = cache_dir()
    docs: list[tuple[str, str]] = []
    counts: Counter[str] = Counter()
    for pkg in PACKAGES:
        try:
            for k, para in enumerate(package_paragraphs(pkg, cache)):
                docs.append((f"{pkg}#{k}", para))
                counts[pkg] += 1
        except Exception as e:  # a package missing from this mirror is reported, not fatal
            print(f"skip {pkg}: {e}", file=sys.stderr)
        print(f"{pkg}: {counts[pkg]:,} paragraphs", file=sys.stderr)
    random.Random(seed).shuffle(docs)
    docs = docs[:limit]
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.jsonl.gz"):  # a larger earlier build's shards must not outlive it
        old.unlink()
    for i in range(0, len(docs), SHARD):
        with gzip.open(out / f"part-{i // SHARD:05d}.jsonl.gz", "wt", encoding="utf-8", compresslevel=1) as f:
            for rid, text in docs[i:i + SHARD]:
                f.write(json.dumps({"id": rid, "text": text, "source": rid.split("#")[0]}, ensure_ascii=False) + "\n")
    stats = {"paragraphs": len(docs), "characters": sum(len(t) for _, t in docs)} | dict(counts)
    (out / "_sources.json").write_text(json.dumps(stats, indent=1))
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("~/.cache/cptkit/scale/paragraphs").expanduser())
    ap.add_argument("--limit", type=int, default=1_200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    inputs = {"limit": args.limit, "seed": args.seed, "packages": PACKAGES}
    built = args.out / "_built.json"  # written last: the corpus is whole and made from these inputs
    if built.exists() and json.loads(built.read_text()) == inputs:
        print(f"{args.out}: built already from the same inputs", file=sys.stderr)
        return
    built.unlink(missing_ok=True)
    stats = build(args.out, args.limit, args.seed)
    built.write_text(json.dumps(inputs))
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
