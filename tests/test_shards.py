"""Shard I/O: formats, precise errors, atomic size-bounded reproducible shards."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.shards import (
    STDIO,
    InputFile,
    ReadStats,
    ShardWriter,
    group_inputs,
    read_records,
    resolve_inputs,
)

RECS = [{"id": f"d{i}", "text": f"text number {i} é 中文", "meta": {"i": i}} for i in range(50)]


def _lines(recs) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_read_formats(tmp_path, suffix):
    data = _lines(RECS)
    if suffix.endswith("gz"):
        data = gzip.compress(data)
    elif suffix.endswith("zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / f"x{suffix}"
    path.write_bytes(data)
    assert list(read_records(str(path))) == RECS


@pytest.mark.parametrize(
    "line, reason",
    [
        (b'{"id": "a" "text": "b"}', "malformed JSON"),
        (b'{"text": "b"}', "no 'id'"),
        (b'{"id": "a"}', "no 'text'"),
        (b'{"id": 3, "text": "b"}', "'id' must be a non-empty string"),
        (b'{"id": "a", "text": "\xff\xfe"}', "invalid UTF-8"),
        (b"[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(_lines(RECS[:2]) + line + b"\n" + _lines(RECS[2:3]))
    with pytest.raises(BadInput) as e:
        list(read_records(str(path)))
    assert str(e.value).startswith(f"{path}:3: ") and reason in str(e.value)
    stats = ReadStats()
    assert [r["id"] for r in read_records(str(path), skip_bad=True, stats=stats)] == ["d0", "d1", "d2"]
    assert stats.bad == 1 and stats.records == 3


def test_empty_and_missing_inputs(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"\n")
    with pytest.raises(BadInput, match="empty.jsonl: input is empty"):
        list(read_records(str(tmp_path / "empty.jsonl")))
    with pytest.raises(CptkitError, match="no such file"):
        resolve_inputs([str(tmp_path / "nope")])
    (tmp_path / "d").mkdir()
    with pytest.raises(CptkitError, match="holds no"):
        resolve_inputs([str(tmp_path / "d")])


def test_resolve_skips_metadata_and_sorts(tmp_path):
    for name in ["b.jsonl", "a.jsonl.gz", "_removed.jsonl", ".hidden.jsonl", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "_index").mkdir()
    (tmp_path / "_index" / "docs.jsonl").write_bytes(b"")
    got = [f.path.rsplit("/", 1)[1] for f in resolve_inputs(str(tmp_path))]
    assert got == ["a.jsonl.gz", "b.jsonl"]
    assert [f.path for f in resolve_inputs(str(tmp_path / "*.jsonl*"))][0].endswith("a.jsonl.gz")


def test_writer_rolls_over_atomically_and_reproducibly(tmp_path):
    for run in ("r1", "r2"):
        with ShardWriter(tmp_path / run, "part-00000", max_records=20) as w:
            for r in RECS:
                w.write(r)
        assert w.files == ["part-00000-0000.jsonl.gz", "part-00000-0001.jsonl.gz", "part-00000-0002.jsonl.gz"]
        assert not list((tmp_path / run).glob(".*"))  # no temporary leftovers
    for name in w.files:
        assert (tmp_path / "r1" / name).read_bytes() == (tmp_path / "r2" / name).read_bytes()
    back = [r for f in w.files for r in read_records(str(tmp_path / "r1" / f))]
    assert back == RECS


def test_writer_abort_leaves_no_partial_shard(tmp_path):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path, "part-00000") as w:
            w.write(RECS[0])
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_finished_empty_output_is_an_empty_input(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "_SUCCESS").write_text("")
    (tmp_path / "done" / "_manifest.json").write_text("{}")
    assert resolve_inputs(str(tmp_path / "done")) == []


def test_a_file_named_twice_is_read_once(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.jsonl").write_bytes(_lines([{"id": "a", "text": "x"}]))
    (d / "b.jsonl").write_bytes(_lines([{"id": "b", "text": "y"}]))
    got = resolve_inputs([str(d), str(d / "b.jsonl"), str(d / "*.jsonl")])
    assert [f.path for f in got] == [str(d / "a.jsonl"), str(d / "b.jsonl")]


def test_background_compression_writes_the_bytes_of_a_line_by_line_gzip(tmp_path):
    """Chunks go through the writer thread; the shard equals gzip of the lines written one by one."""
    import io

    from cptkit.core.records import dumps

    recs = [{"id": f"r{i}", "text": f"line {i} " + "x" * (i % 977)} for i in range(3000)]
    assert sum(len(dumps(r)) for r in recs) > 3 * ShardWriter.CHUNK  # several chunks in flight
    with ShardWriter(tmp_path, "part-00000") as w:
        for r in recs:
            w.write(r)
    ref = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=ref, mtime=0, compresslevel=6) as g:
        for r in recs:
            g.write((dumps(r) + "\n").encode())
    assert w.files == ["part-00000-0000.jsonl.gz"]
    assert (tmp_path / w.files[0]).read_bytes() == ref.getvalue()


def test_a_failing_writer_thread_raises_in_the_caller_and_leaves_no_shard(tmp_path):
    w = ShardWriter(tmp_path, "part-00000")
    w.write({"id": "a", "text": "x"})
    w._fh.close()  # the compressor's stream is gone: the thread's write fails
    with pytest.raises(ValueError, match="closed"), w:
        for i in range(2000):
            w.write({"id": f"r{i}", "text": "y" * 500})
    assert list(tmp_path.iterdir()) == []


def test_small_files_are_grouped_into_tasks_big_ones_stand_alone():
    files = [InputFile(f"f{i}", size) for i, size in enumerate([10, 20, 30, 100, 5, 5, 50, 1])]
    names = [[f.path for f in g] for g in group_inputs(files, 60)]
    assert names == [["f0", "f1", "f2"], ["f3"], ["f4", "f5", "f6"], ["f7"]]  # in order, each <= 60 bytes or alone
    assert [[f.path for f in g] for g in group_inputs(files, 0)] == [[f.path] for f in files]
    assert [len(g) for g in group_inputs([InputFile(STDIO, 0), *files[:2]], 60)] == [1, 2]  # stdin alone
    assert group_inputs([], 60) == []


def test_a_directory_of_many_files_resolves_sorted_with_real_paths(tmp_path):
    (tmp_path / "in" / "b").mkdir(parents=True)
    (tmp_path / "in" / "_side").mkdir()
    for rel in ("b/x.jsonl", "a-c.jsonl", "b.jsonl", "_side/s.jsonl", ".hidden.jsonl", "notes.txt"):
        (tmp_path / "in" / rel).write_text('{"id": "1", "text": "t"}\n')
    (tmp_path / "in" / "link.jsonl").symlink_to(tmp_path / "in" / "b.jsonl")  # the same file again: read once
    got = resolve_inputs(str(tmp_path / "in"))
    names = ["a-c.jsonl", "b/x.jsonl", "b.jsonl"]  # as paths sort: ("b", "x.jsonl") < ("b.jsonl",)
    assert names == sorted(names, key=lambda n: tmp_path / n)
    assert [f.path for f in got] == [str(tmp_path / "in" / n) for n in names]
    assert [f.real for f in got] == [str((tmp_path / "in" / n).resolve()) for n in names]
