"""Real text for the retrieve/BM25 tests when the shared ``corpus_dir`` fixture is absent.

English: paragraphs of the Python 3.11 library docs (Debian ``python3.11-doc``, PSF licence).
Chinese: paragraphs of the Debian Reference (``debian-reference-zh-cn``). Packages are fetched
with ``apt-get download`` once into a cache under /tmp and unpacked with ``dpkg -x``.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("CPTKIT_TEST_CACHE", "/tmp/cptkit-testdata"))


def _unpack(pkg: str) -> Path:
    root = CACHE / pkg
    if (root / ".done").exists():
        return root
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{pkg}_*.deb"))
    if not found:
        subprocess.run(["apt-get", "download", pkg], cwd=debs, check=True, capture_output=True)
        found = sorted(debs.glob(f"{pkg}_*.deb"))
    subprocess.run(["dpkg", "-x", str(found[-1]), str(root)], check=True)
    (root / ".done").write_text("")
    return root


def english_paragraphs(limit: int) -> list[str]:
    src = _unpack("python3.11-doc") / "usr/share/doc/python3.11/html/_sources/library"
    out: list[str] = []
    for f in sorted(src.glob("*.rst.txt")):
        out += [p.strip() for p in f.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) >= 200]
        if len(out) >= limit:
            break
    return out[:limit]


def chinese_paragraphs(limit: int) -> list[str]:
    f = _unpack("debian-reference-zh-cn") / "usr/share/debian-reference/debian-reference.zh-cn.txt.gz"
    text = gzip.open(f, "rt", encoding="utf-8").read()
    paras = [" ".join(p.split()) for p in text.split("\n\n")]
    return [p for p in paras if len(p) >= 60 and "。" in p and sum("\u4e00" <= ch <= "\u9fff" for ch in p) >= 20][:limit]


def write_corpus(directory: Path, n_en: int = 600, n_zh: int = 150, shards: int = 2) -> list[dict]:
    """Write a small real-text corpus as ``shards`` JSONL files; return the records."""
    recs = [{"id": f"en-{i:05d}", "text": t, "source": "python3.11-doc", "lang": "en"}
            for i, t in enumerate(english_paragraphs(n_en))]
    recs += [{"id": f"zh-{i:05d}", "text": t, "source": "debian-reference-zh-cn", "lang": "zh"}
             for i, t in enumerate(chinese_paragraphs(n_zh))]
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(recs) // shards)
    for s in range(shards):
        with open(directory / f"shard-{s:02d}.jsonl", "w", encoding="utf-8") as fh:
            for r in recs[s * per:(s + 1) * per]:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return recs


def queries_from(recs: list[dict], every: int, en_words: slice, zh_chars: slice, extra: dict) -> list[dict]:
    """Queries cut from every ``every``-th document (words for English, characters for Chinese) + ``extra``."""
    queries = []
    for i, r in enumerate(recs[::every]):
        text = " ".join(r["text"].split()[en_words]) if r["lang"] == "en" else r["text"][zh_chars]
        queries.append({"id": f"q{i:03d}", "text": text})
    return [*queries, extra]


def write_queries(path, queries: list[dict]):
    path.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries), encoding="utf-8")
    return path
