"""The forgetting measures' data sources outside the demo corpus (cptkit/demo/outside.py): the
fortune parsers on files in the strfile format, and ``demo-corpus corpus.sources=[...]`` on real
.deb packages built here with ``dpkg-deb`` (no network)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from outputs import shard_paths
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import CptkitError
from cptkit.demo import outside as O
from cptkit.demo.corpus import SOURCES
from cptkit.demo.sources.base import deb_version
from cptkit.steps.demo_corpus import CorpusConfig

runner = CliRunner()

WISDOM = (
    "A cloud does not know why it moves in just such a direction and at such\n"
    "a speed, if feels an impulsion... this is the place to go now.  But the\n"
    "sky knows the reasons and the patterns behind all clouds.\n"
    "\t\t-- Messiah's Handbook : Reminders for the Advanced Soul\n"
    "%\n"
    "A halted retreat\nIs nerve-wracking and dangerous.\n"
    "%\n"
    "   ___\n  (o o)\n  /|_|\\  #### ++ ||| ___ ///\n"  # ASCII art: dropped
    "%\n"
    "\x1b[32mNo.\x1b[m\n"  # shorter than 20 characters: dropped
    "%\n"
)


def _quote(k: int, n: int) -> str:
    """A quotation of about ``n`` characters, hard-wrapped at 70 columns, with an attribution."""
    words = " ".join(f"freedom{k} grows where people {k} decide together" for _ in range(n // 45 + 1))[:n]
    lines = [words[i:i + 70] for i in range(0, len(words), 70)]
    return "\n".join(lines) + f"\n\t\t-- Author {k}\n"


ANARCHISM = "%\n".join([_quote(1, 300), _quote(2, 100), _quote(3, 900), _quote(1, 300).upper(),
                        _quote(4, 1700), _quote(5, 400)]) + "%\n"


def _tree(root: Path, files: dict[str, str]) -> Path:
    base = root / O.FORTUNE_DIR
    base.mkdir(parents=True)
    for name, text in files.items():
        (base / name).write_text(text, encoding="utf-8")
        (base / f"{name}.dat").write_bytes(b"\x00\x00\x00\x02strfile index")
        (base / f"{name}.u8").symlink_to(name)
    return root


def test_fortune_entries_joined_attributed_and_filtered(tmp_path):
    root = _tree(tmp_path / "fortunes", {"wisdom": WISDOM, "zippy": "Yow!  Are we having FUN yet?\n%\n"})
    recs = list(O.fortunes_en_records(root))
    assert [r["id"] for r in recs] == ["fortunes-en/wisdom/00001", "fortunes-en/wisdom/00002",
                                       "fortunes-en/zippy/00001"]  # .dat and .u8 skipped, art and "No." dropped
    first = recs[0]["text"].splitlines()
    assert first[0].startswith("A cloud does not know why it moves in just such a direction and at such a speed,")
    assert first[1] == "-- Messiah's Handbook : Reminders for the Advanced Soul" and len(first) == 2
    assert recs[1]["text"] == "A halted retreat\nIs nerve-wracking and dangerous."  # a poem keeps its lines
    assert recs[0]["meta"] == {"title": "Messiah's Handbook : Reminders for the Advanced Soul",
                               "section": "wisdom", "package": "fortunes"}
    assert {r["lang"] for r in recs} == {"en"} and {r["source"] for r in recs} == {"fortunes-en"}
    with pytest.raises(CptkitError, match=r"usr/share/games/fortunes: not found in the unpacked fortunes"):
        list(O.fortunes_en_records(tmp_path / "empty"))


def test_outside_set_is_paragraph_sized_deduplicated_and_hash_ordered(tmp_path):
    root = _tree(tmp_path / "anarchism", {"anarchism": ANARCHISM})
    recs = list(O.anarchism_records(root))
    # 100 chars: too short; 1700: too long; the upper-case copy of the first: a duplicate
    assert sorted(r["id"] for r in recs) == ["anarchism/anarchism/00001", "anarchism/anarchism/00003",
                                             "anarchism/anarchism/00006"]
    assert all(200 <= len(r["text"]) <= 1500 and r["domain"] == "outside" for r in recs)
    assert [r["id"] for r in recs] == [r["id"] for r in sorted(recs, key=lambda r: O.content_hash(r["text"], 16))]
    assert recs == list(O.anarchism_records(root))


def _deb(cache: Path, package: str, version: str, files: dict[str, str], work: Path) -> Path:
    """A real binary package built with dpkg-deb, named as ``apt-get download`` names it."""
    tree = _tree(work / package, files)
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN/control").write_text(f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
                                         "Maintainer: Test <t@example.org>\nDescription: test fixture\n")
    cache.mkdir(exist_ok=True)
    deb = cache / f"{package}_{version.replace(':', '%3a')}_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True,
                   capture_output=True)
    return deb


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_demo_corpus_builds_the_outside_sources_deterministically(tmp_path):
    cache = tmp_path / "debs"
    _deb(cache, "fortunes", "1:9.9-1", {"wisdom": WISDOM}, tmp_path / "w")
    deb = _deb(cache, "fortune-anarchism", "2.0-1", {"anarchism": ANARCHISM}, tmp_path / "w")
    assert deb_version(deb) == "2.0-1" and deb_version(cache / "fortunes_1%3a9.9-1_all.deb") == "1:9.9-1"
    args = ["corpus.sources=[anarchism,fortunes-en]", f"corpus.cache_dir={cache}"]
    for out in ("a", "b"):
        res = runner.invoke(app, ["demo-corpus", "--out", str(tmp_path / out), "-q", *args])
        assert res.exit_code == 0, res.output
    extra = json.loads((tmp_path / "a/_manifest.json").read_text())["extra"]
    assert extra["package fortunes-en"] == "fortunes 1:9.9-1"
    assert extra["package anarchism"] == "fortune-anarchism 2.0-1"
    assert extra["docs fortunes-en"] == 2 and extra["docs anarchism"] == 3
    names = [p.name for p in shard_paths(tmp_path / "a")]
    assert names == ["part-00006-0000.jsonl.gz", "part-00007-0000.jsonl.gz"]  # after the demo's six
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    recs = [json.loads(line) for name in names for line in gzip.open(tmp_path / "a" / name)]
    assert len({r["id"] for r in recs}) == len(recs) == 5
    assert {r.get("domain") for r in recs} == {None, "outside"}


def test_outside_sources_are_not_in_the_demo_corpus():
    assert CorpusConfig().sources == list(SOURCES)
    assert not set(O.OUTSIDE_SOURCES) & set(SOURCES)
    packages = {s.package for s in SOURCES.values()}
    assert not {s.package for s in O.OUTSIDE_SOURCES.values()} & packages
