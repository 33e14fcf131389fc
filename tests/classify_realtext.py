"""Real text for classifier tests, cut from Debian documentation packages.

``apt-get download`` + ``dpkg -x`` into a cache directory (``$CPTKIT_TEST_CACHE`` or
``~/.cache/cptkit/test-debs``), once per machine. Each reader returns ``n`` records
``{"id", "text", "source"}`` spread evenly over the package, in a fixed order.
"""

from __future__ import annotations

import glob
import gzip
import html
import os
import re
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("CPTKIT_TEST_CACHE", Path.home() / ".cache" / "cptkit" / "test-debs"))


def deb_dir(pkg: str) -> Path:
    """The extracted tree of Debian package ``pkg`` (downloaded on first use)."""
    root = CACHE / pkg
    if (root / ".ok").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    debs = sorted(glob.glob(str(CACHE / f"{pkg}_*.deb"))) or sorted(glob.glob(f"/tmp/debs/{pkg}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", pkg], cwd=CACHE, check=True, capture_output=True)
        debs = sorted(glob.glob(str(CACHE / f"{pkg}_*.deb")))
    subprocess.run(["dpkg", "-x", debs[-1], str(root)], check=True)
    (root / ".ok").write_text("")
    return root


def _spread(items: list[str], n: int) -> list[str]:
    if len(items) <= n:
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def _chunks(paragraphs: list[str], lo: int = 300, hi: int = 1500) -> list[str]:
    out, cur = [], ""
    for p in paragraphs:
        p = p.strip()
        if not p:
            continue
        cur = f"{cur}\n\n{p}" if cur else p
        if len(cur) >= lo:
            out.append(cur[:hi])
            cur = ""
    return out


def _records(texts: list[str], source: str, n: int) -> list[dict]:
    return [{"id": f"{source}-{i:05d}", "text": t, "source": source} for i, t in enumerate(_spread(texts, n))]


def python_docs(n: int) -> list[dict]:
    root = deb_dir("python3.11-doc") / "usr/share/doc/python3.11/html/_sources"
    texts: list[str] = []
    for f in sorted(root.rglob("*.rst.txt")):
        texts += _chunks(re.split(r"\n\s*\n", f.read_text(errors="replace")))
    return _records(texts, "python-docs", n)


def dictionary(n: int) -> list[dict]:
    path = deb_dir("dict-gcide") / "usr/share/dictd/gcide.dict.dz"
    with gzip.open(path, "rt", errors="replace") as f:
        raw = f.read(6_000_000)
    entries = [e.strip() for e in re.split(r"\n\s*\n", raw) if len(e.strip()) >= 200]
    return _records(entries, "gcide", n)


def fortunes_en(n: int) -> list[dict]:
    root = deb_dir("fortunes") / "usr/share/games/fortunes"
    texts: list[str] = []
    for f in sorted(root.iterdir()):
        if f.suffix in (".dat", ".u8") or f.is_symlink() or not f.is_file():
            continue
        texts += [t.strip() for t in f.read_text(errors="replace").split("\n%\n") if len(t.strip()) >= 120]
    return _records(texts, "fortunes", n)


def maxima_docs(n: int) -> list[dict]:
    root = deb_dir("maxima-doc") / "usr/share/doc/maxima-doc/html"
    texts: list[str] = []
    for f in sorted(root.glob("maxima_*.html"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)):
        body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", f.read_text(errors="replace"), flags=re.S)
        body = html.unescape(re.sub(r"<[^>]+>", " ", body))
        texts += _chunks(re.split(r"\n\s*\n", body))
    return _records(texts, "maxima-docs", n)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def poems_zh(n: int) -> list[dict]:
    root = deb_dir("fortunes-zh") / "usr/share/games/fortunes"
    texts: list[str] = []
    for name in ("tang300", "song100"):
        texts += [_ANSI.sub("", t).strip() for t in (root / name).read_text(errors="replace").split("\n%\n")]
    return _records([t for t in texts if len(t) >= 20], "poems-zh", n)


def manpages_zh(n: int) -> list[dict]:
    root = deb_dir("manpages-zh") / "usr/share/man/zh_CN"
    texts: list[str] = []
    for f in sorted(root.rglob("*.gz")):
        if f.is_symlink():
            continue
        lines = gzip.open(f, "rt", errors="replace").read().splitlines()
        body = "\n".join(re.sub(r"\\f[BIRP]|\\-|\\\(..|\\&", "", ln) for ln in lines if not ln.startswith((".", "'")))
        texts += _chunks(re.split(r"\n\s*\n", body), lo=120, hi=800)
    texts = [t for t in texts if len(re.findall(r"[\u4e00-\u9fff]", t)) >= 30]
    return _records(texts, "manpages-zh", n)


# GCIDE subject labels ("(Zool.)", "(Law)", ...) → the English taxonomy of conf/topics/en.yaml.
GCIDE_TOPICS: dict[str, tuple[str, ...]] = {
    "Mathematics and Physics": ("Math.", "Physics", "Geom.", "Alg.", "Arith.", "Opt.", "Optics", "Magnetism",
                                "Astron."),
    "Computer Science and Engineering": ("Computers", "Elec.", "Mech.", "Mach.", "Engin.", "Steam Engine",
                                         "Electronics", "Railroad", "Railroads", "Teleg."),
    "Biology and Chemistry": ("Zool.", "Bot.", "Chem.", "Biol.", "Biochem.", "Genetics", "Biology"),
    "History and Geography": ("Rom. Antiq.", "Gr. Antiq.", "Antiq.", "Jewish Antiq.", "Eng. Hist.", "Geography",
                              "Geog.", "Phys. Geog.", "Eccl. Hist.", "Hist."),
    "Law and Policy": ("Law", "Law.", "Eng. Law", "Scots Law", "Civil Law", "Old Law", "Feudal Law", "Rom. Law",
                       "Old Eng. Law", "Politics"),
    "Philosophy and Logic": ("Logic", "Metaph.", "Philos."),
    "Economics and Business": ("Com.", "Finance", "Stock Exchange", "Polit. Econ.", "Pol. Econ.", "Bookkeeping"),
    "Psychology and Sociology": ("Psychol.", "Ethnol.", "Anthropol.", "Phren."),
    "Security and International Relations": ("Mil.", "Fort.", "Gun.", "Ordnance", "Firearms", "Anc. Armor"),
    "Medicine and Health": ("Med.", "Anat.", "Surg.", "Physiol.", "Pharm.", "Pathol."),
    "Others": ("Mus.", "Music", "Cookery", "Baseball", "Golf", "Card Playing", "Football", "Cricket", "Billiards",
               "Chess", "Tennis", "Fencing"),
}
_GCIDE_TAG = re.compile(r"\(([A-Z][A-Za-z]*\.?(?: [A-Z][A-Za-z]*\.?){0,2})\)")
_GCIDE_SOURCE = re.compile(r"\s*\[(?:1913 Webster|WordNet[^\]]*|PJC|Webster 1913 Suppl\.|[^\]]{0,30}\+PJC)\]")


def gcide_topics(per_topic: int, offset: int = 0) -> list[dict]:
    """Dictionary senses whose subject label names exactly one taxonomy topic: ``per_topic`` per topic.

    A sense (a blank-line separated block of GCIDE, ≥ 80 characters once cleaned) is labelled
    with the topic of its subject labels, e.g. "(Anat.)" → Medicine and Health; blocks with
    labels of two topics are skipped. The labels and the ``[1913 Webster]`` source marks are
    removed from the text, so a classifier must read the definition. ``offset`` skips the first
    senses of each topic (a disjoint set for ``offset >= per_topic`` of an earlier call).
    Records: ``{"id", "text", "topic", "source": "gcide"}``, topics in taxonomy order.
    """
    path = deb_dir("dict-gcide") / "usr/share/dictd/gcide.dict.dz"
    tag_topic = {tag: topic for topic, tags in GCIDE_TOPICS.items() for tag in tags}
    with gzip.open(path, "rt", errors="replace") as f:
        raw = f.read()
    by: dict[str, list[str]] = {t: [] for t in GCIDE_TOPICS}
    for block in re.split(r"\n\s*\n", raw):
        topics = {tag_topic[m] for m in _GCIDE_TAG.findall(block) if m in tag_topic}
        if len(topics) != 1:
            continue
        text = _GCIDE_SOURCE.sub("", _GCIDE_TAG.sub(lambda m: "" if m.group(1) in tag_topic else m.group(0), block))
        text = re.sub(r"[ \t]+", " ", re.sub(r"\s*\n\s*", "\n", text)).strip()
        if len(text) >= 80:
            by[topics.pop()].append(text)
    out = []
    for topic, texts in by.items():
        picked = _spread(texts, per_topic + offset)[offset:]
        out += [{"id": f"gcide-{topic.split()[0].lower()}-{offset + i:05d}", "text": t, "topic": topic,
                 "source": "gcide"} for i, t in enumerate(picked)]
    return out
