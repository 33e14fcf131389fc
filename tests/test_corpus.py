"""The demo corpus: parsers on real Debian package text, the demo-corpus step, the fixture."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from conftest import CORPUS_SLICE, read_jsonl_dir
from outputs import read_manifest, shard_paths
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.demo import corpus
from cptkit.demo.sources import (
    base,
    debian_reference_zh,
    fortunes_zh,
    gcide,
    manpages_zh,
    maxima_docs,
    python_docs,
)

runner = CliRunner()


def _root(source: str) -> Path:
    cache = base.cache_dir()
    return base.extract_deb(base.fetch_deb(corpus.SOURCES[source].package, cache), cache)


# --- the fixture slice ------------------------------------------------------------------------

def test_slice_has_every_source_with_unique_ids(corpus_records):
    by_source: dict[str, int] = {}
    for r in corpus_records:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    assert by_source == {name: CORPUS_SLICE for name in corpus.SOURCES}
    ids = [r["id"] for r in corpus_records]
    assert len(set(ids)) == len(ids) == 6 * CORPUS_SLICE
    assert all(r["id"].startswith(r["source"] + "/") for r in corpus_records)
    assert all(set(r) >= {"id", "text", "source", "url", "lang", "meta"} for r in corpus_records)


def test_slice_languages_and_chinese_text(corpus_records):
    langs: dict[str, set] = {}
    for r in corpus_records:
        langs.setdefault(r["source"], set()).add(r["lang"])
    assert langs == {"python-docs": {"en"}, "maxima-docs": {"en"}, "gcide": {"en"},
                     "manpages-zh": {"zh", "en"}, "debian-reference-zh": {"zh"}, "fortunes-zh": {"zh"}}
    rich = 0
    for r in corpus_records:
        cjk = len(re.findall(r"[\u4e00-\u9fff]", r["text"]))
        if r["lang"] == "zh":
            assert cjk >= 1, r["id"]
            rich += cjk >= 20
        elif r["source"] == "manpages-zh":
            assert base.cjk_share(r["text"]) < 0.05, r["id"]  # untranslated sections
        else:
            assert cjk == 0 or r["source"] == "python-docs", r["id"]  # unicode howtos quote CJK
    assert rich >= 0.85 * 3 * CORPUS_SLICE
    zh_chars = sum(len(re.findall(r"[\u4e00-\u9fff]", r["text"])) for r in corpus_records if r["lang"] == "zh")
    assert zh_chars > 100_000
    # no markup left behind
    for r in corpus_records:
        assert "\x1b" not in r["text"] and "[32m" not in r["text"], r["id"]
        if r["source"] == "python-docs":
            assert ":func:`" not in r["text"] and ".. index::" not in r["text"], r["id"]
        if r["source"] == "maxima-docs":
            assert "<p>" not in r["text"] and "&para;" not in r["text"], r["id"]
        if r["source"] == "manpages-zh":
            assert not re.search(r"^\.(SH|TP|PP|B)\b", r["text"], re.M) and not re.search(r"\\f[BIRP]", r["text"]), r["id"]


def test_slice_min_lengths(corpus_records):
    for r in corpus_records:
        limit = 10 if r["source"] == "fortunes-zh" else 200
        assert limit <= len(r["text"]) <= 20000, (r["id"], len(r["text"]))


def test_shards_load_with_datasets(corpus_dir):
    import datasets

    files = [str(p) for p in shard_paths(corpus_dir, ".jsonl.gz")]
    assert len(files) == 6
    ds = datasets.load_dataset("json", data_files=files, split="train")
    assert ds.num_rows == 6 * CORPUS_SLICE
    assert {"id", "text", "source", "url", "lang"} <= set(ds.column_names)
    assert sorted(set(ds["lang"])) == ["en", "zh"]
    assert ds.features["meta"].keys() == {"title", "section", "package"}


# --- parsers: pure functions on real text -------------------------------------------------------

def test_dictd_base64_numbers():
    assert gcide.dictd_b64("A") == 0 and gcide.dictd_b64("/") == 63
    assert gcide.dictd_b64("BA") == 64
    assert gcide.dictd_b64("Bdh") == 1 * 64 * 64 + 29 * 64 + 33  # "100th" in gcide.index
    with pytest.raises(ValueError):
        gcide.dictd_b64("A*")
    idx = gcide.parse_dictd_index(["00-database-info\tKj\tuk", "1\t+8\tCt", "100th\tBdh\tCC"])
    assert idx == [("1", 62 * 64 + 60, 2 * 64 + 45), ("100th", 5985, 2 * 64 + 2)]
    with pytest.raises(CptkitError, match=r"<index>:1"):
        gcide.parse_dictd_index(["oops"])


def test_gcide_entries_real():
    recs = list(gcide.gcide_records(_root("gcide")))
    assert 60_000 < len(recs) < 90_000
    ids = [r["id"] for r in recs]
    assert len(set(ids)) == len(ids)
    by_id = {r["id"]: r for r in recs}
    bj = next(r for r in recs if "bluejacket" in r["meta"]["section"].split("; "))
    assert "serviceman in the navy" in bj["text"]
    assert all(len(r["text"]) >= 200 for r in recs[:-1])
    assert "{" not in by_id[ids[5000]]["text"]


def test_fortunes_split_and_ansi():
    text = "\x1b[32m《静夜思》\x1b[m\n[33m作者：李白[m\n床前明月光\n%\n\n%\n第二条\n"
    assert fortunes_zh.split_fortunes(text) == ["《静夜思》\n作者：李白\n床前明月光", "第二条"]
    recs = list(fortunes_zh.fortunes_zh_records(_root("fortunes-zh")))
    assert 5_500 < len(recs) < 5_800
    files = {r["meta"]["section"] for r in recs}
    assert files == {"chinese", "song100", "tang300"}  # .u8 links and .dat skipped
    tang = [r for r in recs if r["meta"]["section"] == "tang300"]
    assert len(tang) == 313 and tang[0]["meta"]["title"] == "《感遇・其一》"
    assert tang[0]["text"].splitlines()[1] == "作者：张九龄"


def test_unwrap_joins_chinese_without_space():
    wrapped = ("    这是一个很长的句子，它在七十二列的位置被硬换行了，因此需要重新连接起\n"
               "    来成为一个段落。\n"
               "\n"
               "    # apt-get install package_name\n")
    out = base.unwrap(wrapped)
    assert out.splitlines()[0].strip() == "这是一个很长的句子，它在七十二列的位置被硬换行了，因此需要重新连接起来成为一个段落。"
    assert out.splitlines()[2] == "    # apt-get install package_name"


def test_join_cjk():
    assert base.join_cjk("当然它也参与构造Windows的\"网 络邻居”查看 的浏览协议。 nmbd 是") == \
        "当然它也参与构造Windows的\"网络邻居”查看的浏览协议。 nmbd 是"


def test_merge_short_and_split_long():
    chunks = [base.Chunk("a", "A", "x" * 50), base.Chunk("b", "B", "y" * 300), base.Chunk("c", "C", "z" * 20)]
    merged = base.merge_short(chunks, 200)
    assert [(c.anchor, len(c.text)) for c in merged] == [("a", 50 + 2 + 300 + 2 + 20)]
    parts = base.split_long("\n\n".join(["p" * 400] * 5), 1000)
    assert [len(p) for p in parts] == [802, 802, 400]


def test_split_rst_sections_and_objects():
    src = (":mod:`os` --- OS interfaces\n===========================\n\n.. module:: os\n\n"
           "Intro text with :func:`~os.path.join` and ``literal``.\n\n"
           ".. _files:\n\nFiles and Directories\n---------------------\n\n"
           ".. function:: walk(top, topdown=True)\n              walk(top)\n   :noindex:\n\n"
           "   Walk a tree.\n\n   .. versionadded:: 3.5\n      Something new.\n\n"
           "   .. index:: single: walk\n\n   Example::\n\n      for x in walk('.'):\n          pass\n")
    chunks = python_docs.split_rst(src, "library/os")
    assert [c.anchor for c in chunks] == ["", "files-and-directories", "os.walk"]
    assert chunks[0].text == "`os` --- OS interfaces\n\nIntro text with `join` and `literal`."
    walk = chunks[2].text
    assert walk.startswith("walk(top, topdown=True)\nwalk(top)\n\nWalk a tree.\n\nNew in version 3.5.")
    assert "Example:\n\n   for x in walk('.'):" in walk and "index" not in walk and ":noindex:" not in walk


def test_python_docs_ids_match_sphinx_anchors():
    recs = list(python_docs.python_docs_records(_root("python-docs")))
    assert 7_000 < len(recs) < 9_000
    by_id = {r["id"]: r for r in recs}
    walk = by_id["python-docs/library/os#os.walk"]
    assert walk["url"] == "https://docs.python.org/3.11/library/os.html#os.walk"
    assert "Generate the file names in a directory tree" in walk["text"]
    assert by_id["python-docs/library/stdtypes#str.capitalize"]["text"].startswith("str.capitalize()")
    assert "python-docs/tutorial/controlflow#defining-functions" in by_id


def test_strip_roff_matches_man_rendering():
    root = _root("manpages-zh")
    page = root / "usr/share/man/zh_CN/man1/ls.1.gz"
    stripped = manpages_zh.strip_roff(manpages_zh.read_man_source(page))
    assert stripped.splitlines()[0] == "名称"
    assert "ls - 列出目录内容" in stripped and "-a, --all" in stripped
    assert "\\f" not in stripped and ".TP" not in stripped
    if manpages_zh.man_available():
        rendered = manpages_zh.render_man(page)
        assert rendered.splitlines()[0] == "名称"
        heads = [ln for ln in rendered.splitlines() if ln and not ln[0].isspace()]
        assert heads == [ln for ln in stripped.splitlines() if ln and not ln[0].isspace()]
        # the same words come out, whatever the spacing
        norm = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
        assert norm(rendered)[:500] == norm(stripped)[:500]


def test_debian_reference_sections():
    recs = list(debian_reference_zh.debian_reference_zh_records(_root("debian-reference-zh")))
    assert 300 < len(recs) < 500
    ids = [r["id"] for r in recs]
    assert len(set(ids)) == len(ids)
    sudo = next(r for r in recs if r["meta"]["section"] == "1.1.12. sudo 配置")
    assert sudo["id"] == "debian-reference-zh/1.1.12"
    assert "对于典型的单用户工作站，例如运行在笔记本电脑上的桌面 Debian 系统，通常简单地配置 sudo(8)" in sudo["text"]
    assert "# echo \"penguin  ALL=(ALL) ALL\" >> /etc/sudoers" in sudo["text"]


def test_maxima_sections():
    recs = list(maxima_docs.maxima_docs_records(_root("maxima-docs")))
    assert 1_800 < len(recs) < 2_500
    by_id = {r["id"]: r for r in recs}
    r = by_id["maxima-docs/maxima_76#index-ratcoef"]
    assert r["text"].startswith("Function: ratcoef")
    assert "Returns the coefficient of the expression x^n in the expression expr." in r["text"]


# --- the step -----------------------------------------------------------------------------------

def test_step_resume_determinism_and_cli(tmp_path):
    args = ["corpus.sources=[fortunes-zh,debian-reference-zh]", "corpus.limit_per_source=40"]
    out1, out2 = tmp_path / "a", tmp_path / "b"
    res = runner.invoke(app, ["demo-corpus", "--out", str(out1), "-q", *args])
    assert res.exit_code == 0, res.output
    manifest = read_manifest(out1)
    assert manifest["extra"]["docs fortunes-zh"] == 40 and manifest["extra"]["docs debian-reference-zh"] == 40
    # task names follow the fixed source order, whatever the configured order
    assert [p.name for p in shard_paths(out1)] == ["part-00004-0000.jsonl.gz", "part-00005-0000.jsonl.gz"]
    from cptkit.steps.demo_corpus import run

    # kill-and-resume: drop one task's marker and shard; the rerun redoes only that task
    (out1 / "_SUCCESS").unlink()
    (out1 / ".cptkit/done/00005.json").unlink()
    before = (out1 / "part-00004-0000.jsonl.gz").stat().st_mtime_ns
    run(compose_step("demo-corpus", [f"io.output={out1}", "quiet=true", *args]))
    assert (out1 / "part-00004-0000.jsonl.gz").stat().st_mtime_ns == before
    run(compose_step("demo-corpus", [f"io.output={out2}", "quiet=true", *args]))
    for name in ("part-00004-0000.jsonl.gz", "part-00005-0000.jsonl.gz"):
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes()
    recs = read_jsonl_dir(out2)
    assert [r["id"] for r in recs[:3]] == ["debian-reference-zh/title", "debian-reference-zh/preface/2",
                                           "debian-reference-zh/preface/3.1"]
    assert recs[40]["id"] == "fortunes-zh/chinese/00001"
    assert gzip.decompress((out2 / "part-00005-0000.jsonl.gz").read_bytes()).count(b"\n") == 40


def test_step_errors(tmp_path):
    res = runner.invoke(app, ["demo-corpus", "--out", str(tmp_path / "x"), "corpus.sources=[nope]"])
    assert res.exit_code != 0 and isinstance(res.exception, CptkitError)
    assert "unknown source 'nope'" in str(res.exception)
    assert not (tmp_path / "x").exists()
    with pytest.raises(CptkitError, match="limit_per_source"):
        from cptkit.steps.demo_corpus import run

        run(compose_step("demo-corpus", [f"io.output={tmp_path / 'y'}", "corpus.limit_per_source=-1"]))
    with pytest.raises(CptkitError, match="apt-get download no-such-package-cptkit failed|not available"):
        base.fetch_deb("no-such-package-cptkit", tmp_path / "cache")
