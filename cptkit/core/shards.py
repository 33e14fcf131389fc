"""Sharded JSONL I/O: resolve inputs, read records with precise errors, write atomic shards.

Readers accept ``.jsonl``, ``.jsonl.gz`` and ``.jsonl.zst`` (and ``.json`` lines), Parquet files,
``datasets.save_to_disk`` folders (Arrow files, read with pyarrow) and Common Crawl's WARC and WET
archives (:mod:`cptkit.core.warc`). Files whose
name starts with ``_`` or ``.`` are metadata (manifests, markers, side outputs) and are never
read as data. Writers produce size-bounded shards, each written under a temporary name and
renamed when complete; gzip output is byte-reproducible (no timestamp, no file name).
"""

from __future__ import annotations

import glob as globlib
import gzip
import io
import json
import math
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cptkit.core import remote
from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.procs import pid_alive
from cptkit.core.records import Record, dumps, plain_id_problem, validate
from cptkit.core.redact import mask_known, redact
from cptkit.core.warc import WARC_SUFFIXES, is_warc, warc_records

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst")
TABLE_SUFFIXES = (".parquet", ".arrow")
DATA_SUFFIXES = JSONL_SUFFIXES + (".parquet",) + WARC_SUFFIXES
# a JSON \uD800-\uDFFF escape: json.loads accepts a lone surrogate that UTF-8 cannot encode
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")
STDIO = "-"


class NotJSON(ValueError):
    """``NaN``/``Infinity``/``-Infinity`` in a record: Python's json reads them, JSON has none."""


def _no_constant(name: str) -> Any:
    """``parse_constant`` of record lines: refuse the non-JSON constants instead of reading them
    (they would be written back as invalid JSON)."""
    raise NotJSON(name)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _loads(text: str) -> Any:
    """``json.loads(text, parse_constant=_no_constant)``, without building a decoder per line."""
    if text.startswith("\ufeff"):
        return json.loads(text, parse_constant=_no_constant)  # (its own error for a BOM)
    return _DECODER.decode(text)


@dataclass(frozen=True)
class InputFile:
    """One input shard: its path (or ``-`` for stdin) and size in bytes; ``real``: its path with
    every link resolved (``os.path.realpath``), when known."""

    path: str
    size: int
    real: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return "<stdin>" if self.path == STDIO else self.path


def _data_name(name: str) -> bool:
    return name.endswith(DATA_SUFFIXES) and name[:1] not in ("_", ".", "")


def is_data_file(path: Path) -> bool:
    return path.is_file() and _data_name(path.name)


def _input_file(f: Path) -> InputFile:
    return InputFile(str(f), f.stat().st_size, os.path.realpath(f))


def _data_files(top: Path) -> list[InputFile]:
    """The data files under the directory ``top``, recursively, sorted as paths sort; folders and
    files whose names start with ``.`` or ``_`` are skipped (run state, side outputs)."""
    found: list[tuple[tuple[str, ...], InputFile]] = []

    def walk(d: str, shown: str, real: str, parts: tuple[str, ...]) -> None:
        with os.scandir(d) as it:
            entries = list(it)
        for e in entries:
            if e.name[0] in "_.":
                continue
            try:
                st = e.stat()  # follows links, as Path.is_file does
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if not e.is_symlink():  # (rglob does not descend into linked folders either)
                    walk(e.path, shown + e.name + os.sep, os.path.join(real, e.name), (*parts, e.name))
            elif stat.S_ISREG(st.st_mode) and e.name.endswith(DATA_SUFFIXES):
                real_f = os.path.realpath(e.path) if e.is_symlink() else os.path.join(real, e.name)
                found.append(((*parts, e.name), InputFile(shown + e.name, st.st_size, real_f)))

    base = str(top)  # the paths as str(top / name) writes them ("x", not "./x")
    walk(base, "" if base == "." else base.rstrip(os.sep) + os.sep, os.path.realpath(top), ())
    return [f for _, f in sorted(found, key=lambda f: f[0])]


def saved_dataset_files(p: Path) -> list[Path] | None:
    """The Arrow files of a ``datasets`` ``save_to_disk`` folder, or None if ``p`` is not one."""
    if (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        raise CptkitError(f"{p}: a saved DatasetDict with splits {', '.join(splits)}; pass --in {p}/SPLIT")
    if not ((p / "state.json").is_file() and (p / "dataset_info.json").is_file()):
        return None
    state = json.loads((p / "state.json").read_text())
    files = [p / f["filename"] for f in state.get("_data_files", [])]
    if not files:
        raise CptkitError(f"{p}/state.json: lists no Arrow data files")
    return files


def resolve_inputs(specs: list[str] | str, allow_partial: bool = False) -> list[InputFile]:
    """Expand files, directories (their data files, recursively) and globs into input shards.

    The order is sorted and therefore stable; a file named twice is read once. A spec that
    matches nothing is an error, except
    a step's finished output that holds no records (``_SUCCESS`` and no shards): it is empty.
    A ``save_to_disk`` folder gives its Arrow files, in their order. A step's output directory
    without ``_SUCCESS`` (a run still going, or one that died) is refused unless ``allow_partial``
    (a step's ``io.allow_partial``: :meth:`cptkit.core.run.Run.resolve_inputs` passes it).
    """
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise CptkitError("no input given: pass --in PATH (a file, a directory, a glob or -)")
    found: list[InputFile] = []
    for spec in specs:
        spec = remote.local_path(str(spec))
        if spec == STDIO:
            found.append(InputFile(STDIO, 0))
            continue
        if remote.is_url(spec):  # an object, a prefix or a glob in a store
            found.extend(remote.resolve(spec, _data_name, allow_partial, InputFile))
            continue
        p = Path(spec)
        if p.is_dir():
            arrow = saved_dataset_files(p)
            files = _data_files(p) if arrow is None else [_input_file(f) for f in arrow]
            if (p / ".cptkit").is_dir() and not (p / "_SUCCESS").exists() and not allow_partial:
                raise CptkitError(f"{spec}: a step's output without _SUCCESS (still running, or it died): its "
                                  "shards may be partial; rerun that step to finish it, or pass --allow-partial")
            if not files and (p / "_SUCCESS").exists():
                continue  # the finished, empty output of a step (everything was filtered out)
            if not files:
                raise CptkitError(f"{spec}: directory holds no .jsonl/.jsonl.gz/.jsonl.zst/.parquet shards or .warc.gz/.wet.gz archives")
        elif p.is_file():
            files = [_input_file(p)]
        elif any(ch in spec for ch in "*?["):
            files = [_input_file(f) for f in sorted(Path(f) for f in globlib.glob(spec, recursive=True)
                                                    if is_data_file(Path(f)))]
            if not files:
                raise CptkitError(f"{spec}: glob matches no data files")
        else:
            raise CptkitError(f"{spec}: no such file or directory")
        found.extend(files)
    seen: set[str] = set()
    unique = []
    for f in found:  # a file named twice (a directory and a glob inside it) is read once
        if f.path == STDIO or f.real not in seen:
            seen.add(f.real)
            unique.append(f)
    return unique


def group_inputs(inputs: list[InputFile], task_bytes: int) -> list[list[InputFile]]:
    """The inputs, in their order, packed into groups of at most ``task_bytes`` bytes (the default
    tasks of a step): consecutive small files share a group; a file as big as that alone is a group
    of its own, and so is stdin. ``task_bytes=0``: one group per file."""
    groups: list[list[InputFile]] = []
    size = 0
    for f in inputs:
        alone = f.path == STDIO or (groups and groups[-1][-1].path == STDIO)
        if not groups or alone or not task_bytes or size + f.size > task_bytes:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += f.size
    return groups


class _CountingReader(io.RawIOBase):
    """Wraps a binary file and counts the compressed bytes consumed (for progress bars)."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.consumed = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self.raw.readinto(b)
        self.consumed += n or 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_raw(path: str) -> IO[bytes]:
    """A shard's bytes as stored: a local file, or an object read as a stream (:mod:`cptkit.core.remote`)."""
    return remote.open_raw(path) if remote.is_url(path) else open(path, "rb")  # noqa: SIM115


def open_binary(path: str) -> tuple[IO[bytes], _CountingReader]:
    """Open a shard for binary line reading, decompressing by suffix."""
    if path == STDIO:
        counter = _CountingReader(sys.stdin.buffer)
        return io.BufferedReader(counter), counter
    counter = _CountingReader(open_raw(path))
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=io.BufferedReader(counter), mode="rb"), counter  # type: ignore[return-value]
    if path.endswith(".zst"):
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(io.BufferedReader(counter))
        return io.BufferedReader(stream), counter  # type: ignore[arg-type]
    return io.BufferedReader(counter), counter


@dataclass
class ReadStats:
    records: int = 0
    bad: int = 0
    bytes: int = 0
    line: int = 0  # line (JSONL) or row (Parquet/Arrow, 1-based) of the record last yielded
    truncated: int = 0  # records whose text was cut to max_chars (oversize=truncate)
    skipped: dict[str, int] = field(default_factory=dict)  # WARC records that are no text record, by reason


def _check_record(obj: object, raw: bytes | None, max_chars: int, oversize: str,
                  plain_ids: bool = False) -> tuple[str | None, bool]:
    """(why ``obj`` is not a usable record, whether it was truncated)."""
    err = validate(obj)
    if err is None and plain_ids:
        err = plain_id_problem(obj["id"])  # type: ignore[index]
    if err is not None:
        return err, False
    assert isinstance(obj, dict)
    if raw is not None and _SURROGATE_ESCAPE.search(raw):  # (Arrow strings are valid UTF-8 already)
        try:
            dumps(obj).encode("utf-8")
        except UnicodeEncodeError as e:
            bad = e.object[e.start:e.end].encode("utf-8", "backslashreplace").decode()
            return f"record {obj['id']!r}: lone surrogate {bad} is not valid Unicode (cannot be written as UTF-8)", False
    if max_chars and len(obj["text"]) > max_chars:
        if oversize != "truncate":
            return (f"record {obj['id']!r}: text of {len(obj['text']):,} characters is over io.max_record_chars="
                    f"{max_chars:,} (raise it, or io.oversize=skip|truncate)"), False
        obj["text"] = obj["text"][:max_chars]
        return None, True
    return None, False


def _accept(err: str | None, truncated: bool, name: str, line: int, stats: ReadStats, skip_bad: bool,
            oversize: str) -> bool:
    """Whether a checked record is read: counted in ``stats`` when it is; a bad one (``err``) is
    skipped and counted when ``skip_bad`` (or a long text under ``oversize=skip``), else it is
    :class:`BadInput` naming ``name:line``."""
    if err is None:
        stats.records += 1
        stats.truncated += truncated
        stats.line = line
        return True
    if not skip_bad and not (oversize == "skip" and "io.max_record_chars" in err):
        raise BadInput(name, line, err)
    stats.bad += 1
    return False


def _read_line(fh: IO[bytes], cap: int, drain: bool = True) -> tuple[bytes, bool]:
    """One line, reading at most ``cap`` bytes of it into memory (0: no cap). (line, too_long);
    a line over ``cap`` is drained (or, without ``drain``, its first ``cap + 1`` bytes returned
    and the rest left to read)."""
    if not cap:
        return fh.readline(), False
    raw = fh.readline(cap + 1)
    if len(raw) <= cap or raw.endswith(b"\n"):
        return raw, False
    if not drain:
        return raw, True
    _drain(fh)
    return raw[:64], True


def _drain(fh: IO[bytes]) -> None:
    """Read the rest of the current line without keeping it."""
    while True:
        more = fh.readline(_CHUNK)
        if not more or more.endswith(b"\n"):
            return


_CHUNK = 1 << 20  # bytes of a long line read at once
_STRUCT = re.compile(rb'["{}\[\],]')  # outside strings: what the cutter follows
_HALF_ESCAPE = re.compile(rb"\\(?:u[0-9a-fA-F]{0,3}|u[dD][89abAB][0-9a-fA-F]{2})?$")  # a cut \, \uXX, high surrogate
_KEY_TEXT = b"text"


def _backslashes_before(buf: bytes | bytearray, q: int, lo: int) -> int:
    """How many backslashes end ``buf[lo:q]``."""
    n = 0
    while q - n > lo:
        seg = buf[max(lo, q - n - 64):q - n]
        k = len(seg) - len(seg.rstrip(b"\\"))
        n += k
        if k < len(seg) or not seg:
            return n
    return n


def _whole_chars(text: bytearray) -> bytearray:
    """``text`` (JSON string content cut anywhere) less a trailing half: a UTF-8 sequence, an escape,
    or a high surrogate whose low half was cut off."""
    for k in range(1, min(4, len(text)) + 1):  # a UTF-8 lead byte whose sequence was cut
        b = text[-k]
        if b < 0x80 or b >= 0xC0:
            if b >= 0xC0 and k < (2 if b < 0xE0 else 3 if b < 0xF0 else 4):
                del text[-k:]
            break
    while True:
        m = _HALF_ESCAPE.search(text)
        if m is None or _backslashes_before(text, m.start(), 0) % 2:  # none, or its backslash is escaped
            return text
        del text[m.start():]


def _key_meaning(key: bytearray) -> bytearray:
    """A JSON key's bytes as it means them: an escaped key (``"\\u0074ext"``) decoded, else as written."""
    if b"\\" in key:
        try:
            return bytearray(json.loads(b'"' + key + b'"').encode())
        except ValueError:
            pass
    return key


def _cut_line(head: bytes, fh: IO[bytes], max_chars: int, cap: int) -> bytes | None:
    """A line longer than ``cap`` bytes, of which ``head`` was read, with its top-level ``"text"``
    value cut to ``12 · max_chars + 12`` bytes (more than ``max_chars`` characters: a JSON character is
    at most 12 bytes), reading the rest in chunks and keeping at most ``cap`` bytes: memory stays
    bounded whatever the line's length. None (the line drained) when the other fields alone are over
    ``cap`` bytes."""
    keep = 12 * max_chars + 12
    buf, i = head, 0
    done = head.endswith(b"\n")
    out = bytearray()
    stack = bytearray()  # open { and [
    key_next, key = False, bytearray()

    def more() -> bool:
        nonlocal buf, i, done
        if done:
            return False
        chunk = fh.readline(_CHUNK)
        done = not chunk or chunk.endswith(b"\n")
        buf, i = buf[i:] + chunk, 0
        return bool(chunk)

    while True:
        if len(out) > cap:
            if not done:
                _drain(fh)
            return None
        m = _STRUCT.search(buf, i)
        if m is None:
            out += buf[i:]
            i = len(buf)
            if not more():
                return bytes(out)
            continue
        j = m.start()
        out += buf[i:j + 1]
        i = j + 1
        c = buf[j]
        if c in b"{[":
            stack.append(c)
            key_next = c == ord("{") and len(stack) == 1
        elif c in b"}]":
            del stack[-1:]
        elif c == ord(","):
            key_next = len(stack) == 1 and stack[0] == ord("{")
        else:  # a string: to its closing quote
            top = len(stack) == 1 and stack[0] == ord("{")
            is_key = top and key_next
            is_text = top and not key_next and bytes(key) == _KEY_TEXT
            if is_key:
                key.clear()
            start, length = len(out), 0
            while True:
                q = buf.find(b'"', i)
                while q != -1 and _backslashes_before(buf, q, i) % 2:  # an escaped quote
                    q = buf.find(b'"', q + 1)
                end = q if q != -1 else len(buf) - _backslashes_before(buf, len(buf), i) % 2
                seg = buf[i:end]
                if is_text:
                    out += seg[:max(0, keep - length)]
                else:
                    out += seg
                    if is_key and len(key) <= 64:
                        key += seg[:65]
                length += len(seg)
                i = end
                if q != -1 or len(out) > cap:
                    break
                if not more():
                    return bytes(out)  # an unterminated string: malformed, as the parser will say
            if is_text and length > keep:
                out[start:] = _whole_chars(out[start:])
            if q != -1:
                out += b'"'
                i = q + 1
            if is_key:
                key_next, key = False, _key_meaning(key)


def _decode_line(raw: bytes) -> tuple[Any, str | None]:
    """``(object, None)`` for a line of JSON, or ``(None, why)`` when it is not one."""
    try:
        return _loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start}"
    except json.JSONDecodeError as e:
        return None, f"malformed JSON: {e.msg} (column {e.colno})"
    except NotJSON as e:
        return None, f"malformed JSON: {e} is not JSON (RFC 8259 has no NaN or Infinity)"
    except RecursionError:
        return None, "malformed JSON: nested too deeply"
    except ValueError as e:  # an integer over Python's int_max_str_digits (4300)
        return None, f"malformed JSON: {str(e).split(';')[0]}"


def read_records(
    inp: InputFile | str,
    *,
    skip_bad: bool = False,
    stats: ReadStats | None = None,
    validate_records: bool = True,
    max_chars: int = 0,
    oversize: str = "error",
    plain_ids: bool = False,
    html_extractor: str = "resiliparse",
) -> Iterator[Record]:
    """Yield the records of one shard.

    A malformed line (invalid UTF-8, bad JSON, missing ``id``/``text``, a lone surrogate, a text
    over ``max_chars``) raises :class:`BadInput` naming the file and line, or is counted in
    ``stats.bad`` and skipped when ``skip_bad`` (``oversize=skip`` skips long texts,
    ``truncate`` cuts them). With ``plain_ids``, an id holding a tab, line break or control character is
    such a line too (for steps that write ids into tab- or space-separated files). An empty shard is an
    error: it almost always means an upstream step failed. A WARC or WET archive is read by
    :func:`_read_warc` (``html_extractor``: for the HTML of WARC response records).
    """
    if isinstance(inp, str):
        inp = InputFile(inp, 0)
    stats = stats if stats is not None else ReadStats()
    if inp.path.endswith(TABLE_SUFFIXES):
        yield from _read_table(inp, skip_bad, stats, validate_records, max_chars, oversize, plain_ids)
        return
    if is_warc(inp.path):
        yield from _read_warc(inp, skip_bad, stats, validate_records, max_chars, oversize, plain_ids, html_extractor)
        return
    fh, counter = open_binary(inp.path)
    n_lines = 0
    # JSON escapes make a line up to 12 bytes per character; past that it is too long for sure (truncate:
    # its text is cut while it is read, in bounded chunks)
    cap = 12 * max_chars + 65536 if max_chars else 0
    cut = oversize == "truncate"
    try:
        lineno = 0
        while True:
            try:
                raw, too_long = _read_line(fh, cap, drain=not cut)
                if too_long and cut:
                    kept = _cut_line(raw, fh, max_chars, cap)
                    raw, too_long = (kept, False) if kept is not None else (raw[:64], True)
            except (OSError, EOFError) as e:  # truncated gzip, corrupt zstd ...
                raise BadInput(inp.name, lineno + 1, f"cannot decompress: {e}") from None
            if not raw:
                break
            lineno += 1
            stats.bytes = counter.consumed
            if too_long:
                n_lines += 1
                err = (f"line is over {cap:,} bytes even with its text cut to io.max_record_chars={max_chars:,}"
                       if cut else f"line is over {cap:,} bytes, so its text is over io.max_record_chars={max_chars:,}")
                _accept(err, False, inp.name, lineno, stats, skip_bad, "error" if cut else oversize)
                continue
            if not raw.strip():
                continue
            n_lines += 1
            (obj, err), truncated = _decode_line(raw), False
            if err is None and validate_records:
                err, truncated = _check_record(obj, raw, max_chars, oversize, plain_ids)
            if _accept(err, truncated, inp.name, lineno, stats, skip_bad, oversize):
                yield obj
    finally:
        if inp.path != STDIO:
            fh.close()
    if n_lines == 0:
        raise BadInput(inp.name, None, "input is empty")


def _read_warc(inp: InputFile, skip_bad: bool, stats: ReadStats, validate_records: bool, max_chars: int,
               oversize: str, plain_ids: bool, extractor: str) -> Iterator[Record]:
    """Records of a WARC or WET archive (:func:`cptkit.core.warc.warc_records`); an error names the
    file and the record's byte offset (the decompressed archive's); ``stats.line`` counts archive
    records yielded."""
    counter = _CountingReader(open_raw(inp.path))
    n = 0
    try:
        for offset, obj in warc_records(io.BufferedReader(counter), inp.name, skipped=stats.skipped,
                                        extractor=extractor, skip_bad=skip_bad):
            n += 1
            stats.bytes = counter.consumed
            if isinstance(obj, str):
                err, truncated = obj, False
            else:
                err, truncated = (_check_record(obj, None, max_chars, oversize, plain_ids) if validate_records
                                  else (None, False))
            if err is not None and not skip_bad and not (oversize == "skip" and "io.max_record_chars" in err):
                raise BadInput(inp.name, None, err if err.startswith(("truncated", "record at byte"))
                               else f"record at byte {offset}: {err}")
            if _accept(err, truncated, inp.name, n, stats, True, oversize):
                yield obj  # type: ignore[misc]
    finally:
        counter.close()


def _json_types(schema) -> bool:
    """True when every column of an Arrow schema maps onto JSON values as is."""
    import pyarrow as pa

    def ok(t) -> bool:
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return ok(t.value_type)
        if pa.types.is_struct(t):
            return all(ok(t.field(i).type) for i in range(t.num_fields))
        return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
                or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t))

    return all(ok(f.type) for f in schema)


TABLE_PART_BYTES = 32 << 20  # decoded bytes of the rows of a Parquet/Arrow batch turned into records at once


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A Thrift compact-protocol zigzag varint at ``data[i]``: (value, next index)."""
    n = shift = 0
    while True:
        byte = data[i]
        n |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), i


def _dictionary_page_bytes(path: str, col: Any) -> int:
    """The decoded size of a column chunk's dictionary page, read from its page header (Thrift:
    field 1 the page type, 2 the uncompressed size): the longest value any row can take from it. A
    header that cannot be read counts as the whole chunk's uncompressed size."""
    offset = col.dictionary_page_offset or col.data_page_offset
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(32)
        if head[0] != 0x15:  # field 1, i32
            raise ValueError("no page type")
        kind, i = _varint(head, 1)
        if head[i] != 0x15:  # field 2, i32
            raise ValueError("no page size")
        size, _ = _varint(head, i + 1)
        if kind == 2 and size >= 0:  # DICTIONARY_PAGE
            return size
    except (OSError, ValueError, IndexError):
        pass
    return max(int(col.total_uncompressed_size), 0)


def _batch_rows(path: str, pf: Any, group: int) -> int:
    """Rows per batch of a Parquet row group such that a batch decodes to at most about
    :data:`TABLE_PART_BYTES` whatever its rows hold: a dictionary-encoded column can repeat its
    longest value on every row (a 1.6 KB file can decode to gigabytes in one batch of 1,024)."""
    rg = pf.metadata.row_group(group)
    worst = 0  # bytes one row can take from the dictionaries
    for j in range(rg.num_columns):
        col = rg.column(j)
        if col.has_dictionary_page:
            per_row = max(1, col.num_values // max(rg.num_rows, 1))  # a list column's values per row
            worst += _dictionary_page_bytes(path, col) * per_row
    return max(1, min(1024, TABLE_PART_BYTES // worst)) if worst else 1024


def _table_rows(batch: Any, max_chars: int, oversize: str, cap: int) -> Iterator[tuple[dict | None, int, bool]]:
    """``(row, decoded bytes, text cut)`` for each row of an Arrow batch. Dictionary columns are sized
    from their dictionaries first, then decoded at most :data:`TABLE_PART_BYTES` at a time (at least one
    row); a row over ``cap`` decoded bytes is not decoded (``row`` None). ``oversize=truncate`` cuts
    the ``text`` dictionary's values to ``max_chars`` before anything is decoded."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    sizes, cut = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    cols, coded = [], []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_dictionary(col.type):
            values = col.dictionary
            if (name == "text" and oversize == "truncate" and max_chars
                    and (pa.types.is_string(values.type) or pa.types.is_large_string(values.type))):
                long = pc.greater(pc.utf8_length(values), max_chars)
                if pc.any(long).as_py():
                    cut |= pc.fill_null(pc.take(long, col.indices), False).to_numpy(zero_copy_only=False)
                    values = pc.utf8_slice_codeunits(values, 0, max_chars)
                    col = pa.DictionaryArray.from_arrays(col.indices, values)
            sizes += pc.fill_null(pc.take(pc.binary_length(values), col.indices), 0).to_numpy(zero_copy_only=False)
            coded.append(len(cols))
        cols.append(col)
    i = 0
    while i < n:
        if cap and sizes[i] > cap:
            yield None, int(sizes[i]), bool(cut[i])
            i += 1
            continue
        j, total = i + 1, int(sizes[i])
        while j < n and not (cap and sizes[j] > cap) and total + sizes[j] <= TABLE_PART_BYTES:
            total += int(sizes[j])
            j += 1
        part = [c.slice(i, j - i) for c in cols]
        part = [c.dictionary_decode() if k in coded else c for k, c in enumerate(part)]
        rows = pa.RecordBatch.from_arrays(part, names=batch.schema.names)
        decoded = rows.to_pylist()
        if not _json_types(rows.schema):  # timestamps, bytes, decimals: as JSON would write them
            decoded = [json.loads(json.dumps(r, ensure_ascii=False, default=str)) for r in decoded]
        for k, row in enumerate(decoded):
            yield row, int(sizes[i + k]), bool(cut[i + k])
        i = j


def _read_table(inp: InputFile, skip_bad: bool, stats: ReadStats, validate_records: bool, max_chars: int,
                oversize: str, plain_ids: bool = False) -> Iterator[Record]:
    """Records of a Parquet file or a ``save_to_disk`` Arrow file, row by row in batches whose decoded
    size is bounded (:func:`_table_rows`): a row that would decode to more than a JSON line may hold
    (``12 · max_chars + 64 KiB`` bytes) is bad input, found before it is decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cap = 12 * max_chars + 65536 if max_chars else 0
    try:
        if inp.path.endswith(".parquet"):
            pf = pq.ParquetFile(open_raw(inp.path) if remote.is_url(inp.path) else inp.path)
            total = pf.metadata.num_rows
            batches = (b for g in range(pf.metadata.num_row_groups)
                       for b in pf.iter_batches(batch_size=_batch_rows(inp.path, pf, g), row_groups=[g]))
        else:
            total = 0
            src = pa.PythonFile(open_raw(inp.path)) if remote.is_url(inp.path) else pa.memory_map(inp.path)
            try:
                batches = iter(pa.ipc.open_stream(src))
            except pa.ArrowInvalid:
                batches = iter(pa.ipc.open_file(src).to_batches())
        row = 0
        for batch in batches:
            for obj, size, cut in _table_rows(batch, max_chars, oversize, cap):
                row += 1
                if obj is None:
                    err = (f"row decodes to {size:,} bytes, over {cap:,}: "
                           + ("its other fields are too long even with its text cut to" if cut or oversize == "truncate"
                              else "its text is over") + f" io.max_record_chars={max_chars:,}")
                    _accept(err, False, inp.name, row, stats, skip_bad, "error" if oversize == "truncate" else oversize)
                    continue
                err, truncated = (_check_record(obj, None, max_chars, oversize, plain_ids) if validate_records
                                  else (None, False))
                if _accept(err, truncated or cut, inp.name, row, stats, skip_bad, oversize):
                    yield obj
            stats.bytes = inp.size * row // total if total else 0
    except (pa.ArrowException, OSError) as e:
        raise BadInput(inp.name, None, f"cannot read as {'Parquet' if inp.path.endswith('.parquet') else 'Arrow'}: "
                       f"{str(e).splitlines()[0]}") from None
    if row == 0:
        raise BadInput(inp.name, None, "input is empty")


def iter_records(inputs: list[InputFile], **kw) -> Iterator[Record]:
    for inp in inputs:
        yield from read_records(inp, **kw)


# The process named in temporary files (``.NAME.tmp-PID``): the one holding the output's lock
# (:class:`cptkit.core.job.Job` sets it), so that a worker it forks names its parent, a live writer.
OWNER_PID: list[int] = []


def tmp_name(path: Path) -> Path:
    """``path``'s temporary name, ``.NAME.tmp-PID``: PID is this process, or the output's lock holder
    that forked it (a temporary file of a PID that holds no lock is a dead writer's: Job removes it)."""
    return path.with_name(f".{path.name}.tmp-{OWNER_PID[-1] if OWNER_PID else os.getpid()}")


def open_new(path: Path) -> IO[bytes]:
    """Open a new file for writing, never through a link: ``O_EXCL|O_NOFOLLOW``. A file or link
    already at ``path`` (a dead writer's, or one planted there) is removed first (the link itself,
    never its target)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except FileExistsError:
        Path(path).unlink()
        fd = os.open(path, flags, 0o666)
    return os.fdopen(fd, "wb")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and an atomic rename: a link at ``path`` is
    replaced by the file (``os.replace`` swaps the link itself), never written through."""
    with atomic_path(path) as tmp, open_new(tmp) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` (:func:`tmp_name`) for the block to write, renamed over ``path``
    when the block ends: ``path`` is then complete, and a block (or a rename) that fails leaves neither
    ``path`` nor the temporary file. For writers that take a file name (a library's: GGUF)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by ``None``: valid JSON (RFC 8259 has no NaN).
    A standard error of one document, a loss that diverged: written as ``null``, read back by any parser."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def atomic_write_json(path: Path, obj, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically: secrets masked (manifests, markers, stats: cptkit.core.redact),
    non-finite numbers as ``null``. ``indent=None``: one line (run state: quick to write when long)."""
    obj = redact(obj)
    try:
        text = json.dumps(obj, indent=indent, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere (rare: walk the object only then)
        text = json.dumps(finite(obj), indent=indent, ensure_ascii=False, default=str, allow_nan=False)
    atomic_write_bytes(Path(path), (text + "\n").encode())


@contextmanager
def staged(dst: Path) -> Iterator[Path]:
    """A new folder for a writer that makes whole files itself (``save_pretrained``), inside the
    directory ``dst``: ``dst/.staged.tmp-PID``. When the block ends, each of its files is renamed
    into ``dst`` (atomic; a link there is replaced, never written through); a block that fails
    leaves nothing. A staged folder of a process that is gone is removed first."""
    dst = Path(dst)
    for old in dst.glob(".staged.tmp-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if old.is_dir() and not old.is_symlink() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    tmp = tmp_name(dst / "staged")
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        for f in sorted(tmp.iterdir()):
            if not f.is_file() or f.is_symlink():
                raise CptkitError(f"{f}: a staged output may hold plain files only")
            os.replace(f, dst / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ShardWriter:
    """Write records into size-bounded shards ``{prefix}-{k:04d}.jsonl[.gz|.zst]``.

    Every shard is written under a hidden temporary name and renamed once closed, so a reader
    never sees a partial shard. Output to ``-`` streams plain JSONL to stdout instead.

    Lines are gathered into chunks of ``CHUNK`` bytes, and each chunk is compressed and written
    by a background thread while the caller produces the next (zlib and zstd release the GIL):
    compression overlaps the step's own work. The bytes are those of writing line by line.
    Known secrets are masked in every line (``mask=False``: run state that a masking writer copies
    later); ``max_bytes=0``: one shard; ``zstd_level``: speed against size of ``zst`` shards.
    """

    CHUNK = 256 * 2**10

    def __init__(
        self,
        directory: str | Path,
        prefix: str = "part",
        *,
        compression: str = "gz",
        max_bytes: int = 256 * 2**20,
        max_records: int = 0,
        zstd_level: int = 3,
        mask: bool = True,
    ):
        self.stdout = str(directory) == STDIO
        self.directory = Path(directory)
        self.prefix, self.compression = prefix, compression
        self.max_bytes, self.max_records = max_bytes, max_records
        self.zstd_level, self.mask = zstd_level, mask
        self.files: list[str] = []
        self.records = 0
        self._fh: IO[bytes] | None = None
        self._raw: IO[bytes] | None = None
        self._tmp: Path | None = None
        self._final: Path | None = None
        self._bytes = 0
        self._in_shard = 0
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def _suffix(self) -> str:
        return {"gz": ".jsonl.gz", "zst": ".jsonl.zst", "none": ".jsonl"}[self.compression]

    def _open(self) -> None:
        k = len(self.files)
        self._final = self.directory / f"{self.prefix}-{k:04d}{self._suffix()}"
        self._tmp = tmp_name(self._final)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._raw = open_new(self._tmp)
        if self.compression == "gz":
            self._fh = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0, compresslevel=6)  # type: ignore[assignment]
        elif self.compression == "zst":
            import zstandard

            self._fh = zstandard.ZstdCompressor(level=self.zstd_level).stream_writer(self._raw, closefd=False)  # type: ignore[assignment]
        else:
            self._fh = self._raw
        self._bytes = self._in_shard = 0

    def _flush(self, last: bool = False) -> None:
        """Hand the gathered lines to the writer thread (after the previous chunk is written); a
        shard's only chunk is written here (no thread for small shards)."""
        if not self._buf:
            return
        chunk = b"".join(self._buf)
        self._buf, self._buf_bytes = [], 0
        if last and self._pool is None:
            self._fh.write(chunk)  # type: ignore[union-attr]
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="cptkit-shard-writer")
        self._wait()
        self._pending = self._pool.submit(self._fh.write, chunk)  # type: ignore[union-attr]

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # re-raises the writer thread's error (e.g. disk full)

    def _close_shard(self) -> None:
        if self._fh is None:
            return
        self._flush(last=True)
        self._wait()
        if self._fh is not self._raw:
            self._fh.close()
        assert self._raw is not None and self._tmp is not None and self._final is not None
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        os.replace(self._tmp, self._final)
        self.files.append(self._final.name)
        self._fh = self._raw = self._tmp = None

    def write(self, rec: Record) -> None:
        self.write_line(dumps(rec))

    def write_line(self, line: str) -> None:
        """Write a record serialised by :func:`cptkit.core.records.dumps` (no newline): the bytes
        of ``write`` of that record."""
        data = ((mask_known(line) if self.mask else line) + "\n").encode("utf-8")
        self.records += 1
        if self.stdout:
            sys.stdout.buffer.write(data)
            return
        if self._fh is None:
            self._open()
        self._buf.append(data)
        self._buf_bytes += len(data)
        if self._buf_bytes >= self.CHUNK:
            self._flush()
        self._bytes += len(data)
        self._in_shard += 1
        if (self.max_bytes and self._bytes >= self.max_bytes) or (
            self.max_records and self._in_shard >= self.max_records
        ):
            self._close_shard()

    def close(self) -> None:
        if self.stdout:
            sys.stdout.buffer.flush()
        else:
            try:
                self._close_shard()
            finally:
                self._stop()

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def abort(self) -> None:
        """Drop the shard being written (its temporary file); finished shards stay."""
        self._buf, self._buf_bytes = [], 0
        try:
            self._wait()
        except Exception:  # noqa: BLE001 - the shard is being dropped anyway
            pass
        self._stop()
        if self._raw is not None:
            self._raw.close()
        if self._tmp is not None and self._tmp.exists():
            self._tmp.unlink()
        self._fh = self._raw = self._tmp = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
