"""Hostile input v5, memory bombs outside the default mode (issue 53, cases 12 and 13): a line of
hundreds of megabytes under ``io.oversize=truncate``, and a Parquet file of 1.6 KB whose one
dictionary string repeated over 400 rows decodes to 800 MB. Each is read under an address-space
limit (``RLIMIT_AS``, set in a child once its imports are done) a few hundred MB above what the
child holds: it fails there without the bound, and passes with it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cptkit.core.errors import BadInput
from cptkit.core.shards import ReadStats, read_records

ROOT = Path(__file__).resolve().parents[1]
HEADROOM_MB = 256  # address space the child may add to what it holds after its imports

LIMITED = """
import json, resource, sys
{imports}
vsz = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) // 1024
resource.setrlimit(resource.RLIMIT_AS, ((vsz + {headroom}) << 20,) * 2)
{body}
"""


def limited(body: str, imports: str, headroom: int = HEADROOM_MB, args: tuple = ()) -> subprocess.CompletedProcess:
    """Run ``body`` in a child Python whose address space may grow ``headroom`` MB past its size after ``imports``."""
    code = LIMITED.format(imports=imports, headroom=headroom, body=body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2"}  # arenas reserve address space
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)


READ = """
from cptkit.core.shards import ReadStats, read_records
st, out = ReadStats(), []
for r in read_records(sys.argv[1], max_chars=int(sys.argv[2]), oversize=sys.argv[3], stats=st):
    out.append([r["id"], len(r["text"])])
print(json.dumps({"records": out, "truncated": st.truncated, "bad": st.bad}))
"""


def huge_line_zst(path: Path, mb: int) -> Path:
    """A .zst of two records, the first with a text of ``mb`` MB (with escapes) and a field after it."""
    import zstandard

    with open(path, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as w:
        w.write(b'{"id":"big","text":"')
        block = b"ab\\n\\u00e9\\\\" * (1 << 17)
        for _ in range((mb << 20) // len(block)):
            w.write(block)
        w.write(b'","meta":{"k":1}}\n{"id":"small","text":"ok"}\n')
    return path


def test_truncate_reads_a_huge_line_in_bounded_memory(tmp_path):
    """Case 12: io.oversize=truncate lifted the line cap, so one line of a .zst was read whole (3.6 GB
    of RSS for 5 GB); now it is read in bounded chunks, its text cut while it is read."""
    path = huge_line_zst(tmp_path / "bomb.jsonl.zst", 400)
    assert path.stat().st_size < 200_000
    r = limited(READ, "import cptkit.core.shards, zstandard", args=(path, 1000, "truncate"))
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got == {"records": [["big", 1000], ["small", 2]], "truncated": 1, "bad": 0}


def test_truncate_cuts_only_the_text_and_keeps_every_other_field(tmp_path):
    """Lines over the cap are cut as they are read: the text's first max_chars characters (any mix of
    escapes, multi-byte and astral characters), every other field exactly as written."""
    rng = random.Random(0)
    alphabet = ["a", "é", "中", "😀", "\n", '"', "\\", "\t", "\\u"]
    for trial in range(40):
        mc = rng.choice([1, 2, 3, 10, 100])
        text = "".join(rng.choice(alphabet) for _ in range(12 * mc + 65536 + rng.randint(1, 3000)))
        rec = ({"id": "x", "text": text, "meta": {"text": "inner", "k": [1, {"text": "z"}]}} if trial % 2
               else {"text": text, "id": 'y\\"', "a": "b"})
        path = tmp_path / f"t{trial}.jsonl"
        path.write_bytes(json.dumps(rec, ensure_ascii=bool(trial % 3)).encode() + b"\n"
                         + b'{"id":"next","text":"k"}\n')
        st = ReadStats()
        got = list(read_records(str(path), max_chars=mc, oversize="truncate", stats=st))
        assert got == [{**rec, "text": text[:mc]}, {"id": "next", "text": "k"}] and st.truncated == 1
    # a long field that is not the text is not cut: the line is too long even so
    path = tmp_path / "meta.jsonl"
    path.write_text(json.dumps({"id": "m", "text": "a", "meta": {"x": "b" * 100_000}}) + "\n")
    with pytest.raises(BadInput, match=r"meta.jsonl:1: line is over 77,536 bytes even with its text cut to "
                                       r"io.max_record_chars=1,000"):
        list(read_records(str(path), max_chars=1000, oversize="truncate"))
    st = ReadStats()
    assert list(read_records(str(path), max_chars=1000, oversize="truncate", skip_bad=True, stats=st)) == []
    assert st.bad == 1


def dictionary_bomb(path: Path, rows: int = 400, mb: int = 2) -> Path:
    """A Parquet file whose text column holds one ``mb`` MB string in its dictionary, for every row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * (mb << 20)]))
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "text": text}), path, compression="zstd",
                   compression_level=22)
    return path


def test_a_parquet_dictionary_bomb_is_read_in_bounded_memory(tmp_path):
    """Case 13: 1.6 KB of Parquet decoded 400 rows x the dictionary's string in one batch (out of
    memory); now a row group's batch size comes from its dictionary pages' sizes (read from their
    page headers): a batch decodes to about 32 MiB at most, whatever its rows repeat."""
    path = dictionary_bomb(tmp_path / "bomb.parquet")
    assert path.stat().st_size < 4000
    imports = "import cptkit.core.shards, pyarrow.parquet, pyarrow.compute, numpy"
    r = limited(READ, imports, args=(path, 5_000_000, "error"))  # 2 MB texts are records like any other
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["records"] == [[f"r{i}", 2 << 20] for i in range(400)] and got["bad"] == 0
    r = limited(READ, imports, args=(path, 1000, "truncate"))  # cut in the dictionary, before decoding
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {"records": [[f"r{i}", 1000] for i in range(400)], "truncated": 400, "bad": 0}
    # a row that decodes to more than a line may hold is refused before it is decoded (a column that is
    # a dictionary in the file's Arrow schema is read as one)
    with pytest.raises(BadInput, match=r"bomb.parquet:1: row decodes to 2,097,15\d bytes, over 77,536: its text is "
                                       r"over io.max_record_chars=1,000"):
        list(read_records(str(path), max_chars=1000))


def test_a_parquet_dictionary_bomb_is_one_line_and_leaves_nothing(tmp_path):
    """Case 13 through a step: one line naming the file and row, exit 2, and no ``.cptkit`` left in the
    output (an out-of-memory kept it)."""
    path = dictionary_bomb(tmp_path / "bomb.parquet")
    out = tmp_path / "out"
    body = ("sys.argv = ['cptkit', 'dedup', '--in', sys.argv[1], '--out', sys.argv[2], '-q', "
            "'io.max_record_chars=1000']\nfrom cptkit.cli import main\nmain()")
    imports = "import cptkit.cli, cptkit.steps.dedup, cptkit.core.shards, pyarrow.parquet, pyarrow.compute, numpy"
    r = limited(body, imports, headroom=512, args=(path, out))
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, r.stderr[-2000:]
    assert "bomb.parquet:1: row decodes to 2,097,15" in err, err
    assert not out.exists()


def test_a_dictionary_bomb_without_an_arrow_schema_is_read_in_bounded_memory(tmp_path):
    """The same bomb written by another Parquet writer (no Arrow schema: the column reads back as plain
    strings): the batch size read from its dictionary page header bounds what one batch decodes."""
    import pyarrow.parquet as pq

    path = dictionary_bomb(tmp_path / "plain.parquet")
    t = pq.read_table(path, read_dictionary=["text"])
    pq.write_table(t.replace_schema_metadata(None), path, compression="zstd", compression_level=22,
                   store_schema=False)
    assert path.stat().st_size < 4000 and pq.read_schema(path).field("text").type == "string"
    imports = "import cptkit.core.shards, pyarrow.parquet, pyarrow.compute, numpy"
    r = limited(READ, imports, headroom=384, args=(path, 5_000_000, "error"))  # 800 MB in one batch before
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["records"] == [[f"r{i}", 2 << 20] for i in range(400)]
    with pytest.raises(BadInput, match=r"plain.parquet:1: record 'r0': text of 2,097,152 characters is over"):
        list(read_records(str(path), max_chars=1000))
