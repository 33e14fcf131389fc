"""fastText model files (``.bin``, quantized ``.ftz``): checked before fastText reads them.

fastText's loader trusts the file: cut short inside the dictionary, it reads end-of-file as word
characters for ever (memory grows without bound); cut inside a matrix, it keeps the zeros it could
not read and predicts 0.5 for everything. :func:`fasttext_layout` walks the layout that
fastText 0.9's ``FastText::loadModel`` reads (little-endian, ``src/fasttext.cc``, ``args.cc``,
``dictionary.cc``, ``densematrix.cc``, ``quantmatrix.cc``/``qmatrix.cc``,
``productquantizer.cc``) and checks that every count and size fits the file, to its last byte:

* header: magic ``int32 793712314``, version ``int32`` (11 or 12);
* Args: 12 ``int32`` (dim, ws, epoch, minCount, neg, wordNgrams, loss, model, bucket, minn, maxn,
  lrUpdateRate) and ``float64`` t;
* Dictionary: ``int32`` size, nwords, nlabels, ``int64`` ntokens, pruneidx_size; per entry a
  NUL-terminated word, ``int64`` count, ``int8`` type (0 word, 1 label); pruneidx_size pairs of
  ``int32``;
* input: ``bool`` quantized, then a dense matrix (``int64`` m, n, m·n ``float32``) or a quantized
  one (``bool`` qnorm, ``int64`` m, n, ``int32`` codesize, codes, a product quantizer: ``int32``
  dim, nsubq, dsub, lastdsub, dim·256 ``float32`` centroids; with qnorm m norm codes and a second
  quantizer);
* output: ``bool`` qout, then a quantized matrix (when the input is quantized and qout) or a dense one.

:func:`load_fasttext` is the one way cptkit opens a fastText model: check, then ``fasttext.load_model``.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError

MAGIC = 793712314
VERSIONS = (11, 12)  # fastText 0.9 reads both (11: older supervised models without char n-grams)
KSUB = 256  # centroids per sub-quantizer
_ARGS = struct.Struct("<12id")
_DICT = struct.Struct("<3i2q")
_LOSSES, _MODELS = (1, 2, 3, 4), (1, 2, 3)  # hs ns softmax ova; cbow sg sup


class FastTextFileError(ValueError):
    """What is wrong with a fastText model file (without its name)."""


@dataclass(frozen=True)
class FastTextLayout:
    """What a well-formed fastText model file holds."""

    version: int
    dim: int
    model: int  # 1 cbow, 2 skipgram, 3 supervised
    nwords: int
    nlabels: int
    quantized: bool
    input_rows: int
    output_rows: int
    size: int  # bytes


class _Reader:
    """Bounds-checked little-endian reads from a buffer; a short read names what was cut."""

    def __init__(self, buf: Any):
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise FastTextFileError(f"truncated: {what} needs {n:,} bytes at offset {self.pos:,}, "
                                    f"the file has {self.size:,} bytes")

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        self.need(fmt.size, what)
        out = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return out

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def flag(self, what: str) -> bool:
        (b,) = self.unpack(struct.Struct("<B"), what)
        if b > 1:
            raise FastTextFileError(f"{what} at offset {self.pos - 1:,} is {b}, not a bool (0 or 1)")
        return bool(b)

    def word(self, i: int) -> None:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise FastTextFileError(f"truncated: dictionary entry {i} (offset {self.pos:,}) has no end "
                                    f"before the end of the file ({self.size:,} bytes)")
        self.pos = end + 1


def _dictionary(r: _Reader, model: int) -> tuple[int, int, int]:
    """Walk the dictionary; returns (nwords, nlabels, pruneidx_size)."""
    size, nwords, nlabels, _, pruned = r.unpack(_DICT, "the dictionary header")
    if min(size, nwords, nlabels) < 0 or size != nwords + nlabels:
        raise FastTextFileError(f"dictionary sizes do not add up: size {size}, {nwords} words, {nlabels} labels")
    if model == 3 and nlabels < 1:
        raise FastTextFileError("a supervised model with no labels in its dictionary")
    if pruned < -1:
        raise FastTextFileError(f"dictionary prune index size {pruned} (must be -1 or ≥ 0)")
    r.need(size * 10 + max(pruned, 0) * 8, f"a dictionary of {size:,} entries")  # ≥ 10 bytes per entry
    entry = struct.Struct("<qb")
    for i in range(size):
        r.word(i)
        count, kind = r.unpack(entry, f"dictionary entry {i}")
        if kind != (0 if i < nwords else 1) or count < 0:
            raise FastTextFileError(f"dictionary entry {i}: type {kind}, count {count} "
                                    f"(words first, then labels; counts ≥ 0)")
    r.skip(max(pruned, 0) * 8, "the dictionary prune index")
    return nwords, nlabels, pruned


def _dense(r: _Reader, what: str, dim: int) -> int:
    m, n = r.unpack(struct.Struct("<2q"), f"the {what} matrix shape")
    if m < 0 or n != dim:
        raise FastTextFileError(f"the {what} matrix is {m} × {n}, expected n = dim = {dim}")
    r.skip(m * n * 4, f"the {what} matrix ({m:,} × {n} float32)")
    return m


def _quantizer(r: _Reader, what: str, dim: int) -> int:
    """One product quantizer; returns its number of sub-quantizers."""
    qdim, nsubq, dsub, lastdsub = r.unpack(struct.Struct("<4i"), f"the {what} quantizer")
    ok = (qdim == dim and dsub > 0 and nsubq == -(-dim // dsub)
          and lastdsub == (dim % dsub or dsub))
    if not ok:
        raise FastTextFileError(f"the {what} quantizer: dim {qdim}, {nsubq} sub-quantizers of {dsub} "
                                f"(last {lastdsub}) do not fit dim {dim}")
    r.skip(qdim * KSUB * 4, f"the {what} quantizer centroids ({qdim} × {KSUB} float32)")
    return nsubq


def _quantized(r: _Reader, what: str, dim: int) -> int:
    qnorm = r.flag(f"the {what} matrix qnorm flag")
    m, n, codesize = r.unpack(struct.Struct("<2qi"), f"the {what} matrix header")
    if m < 0 or n != dim or codesize < 0:
        raise FastTextFileError(f"the quantized {what} matrix is {m} × {n} ({codesize} codes), "
                                f"expected n = dim = {dim}")
    r.skip(codesize, f"the {what} matrix codes")
    nsubq = _quantizer(r, what, dim)
    if codesize != m * nsubq:
        raise FastTextFileError(f"the {what} matrix has {codesize:,} codes, expected {m:,} rows × {nsubq}")
    if qnorm:
        r.skip(m, f"the {what} matrix norm codes")
        _quantizer(r, f"{what} norm", 1)
    return m


def fasttext_layout(buf: Any) -> FastTextLayout:
    """Check a fastText model held in ``buf`` (bytes or an mmap); raise :class:`FastTextFileError`
    naming the first thing that does not fit. Pure: reads ``buf`` only."""
    r = _Reader(buf)
    if r.size == 0:
        raise FastTextFileError("empty file (0 bytes)")
    magic, version = r.unpack(struct.Struct("<2i"), "the header (magic number, version)")
    if magic != MAGIC:
        raise FastTextFileError(f"not a fastText model (magic number {magic}, expected {MAGIC})")
    if version not in VERSIONS:
        raise FastTextFileError(f"fastText file format version {version}; this fastText reads "
                                f"{' and '.join(map(str, VERSIONS))}")
    (dim, _, _, _, _, _, loss, model, bucket, minn, maxn, _, _) = r.unpack(_ARGS, "the training arguments")
    if not (0 < dim <= 1_000_000 and loss in _LOSSES and model in _MODELS and bucket >= 0 and 0 <= minn
            and 0 <= maxn):
        raise FastTextFileError(f"implausible training arguments (dim {dim}, loss {loss}, model {model}, "
                                f"bucket {bucket}, minn {minn}, maxn {maxn})")
    nwords, nlabels, pruned = _dictionary(r, model)
    quantized = r.flag("the input quantization flag")
    if quantized:
        rows = _quantized(r, "input", dim)
    else:
        if pruned >= 0:
            raise FastTextFileError("a pruned dictionary with a dense input matrix (fastText refuses it)")
        rows = _dense(r, "input", dim)
    if rows != nwords + (bucket if pruned < 0 else pruned):
        raise FastTextFileError(f"the input matrix has {rows:,} rows for {nwords:,} words and "
                                f"{bucket if pruned < 0 else pruned:,} n-gram rows")
    qout = r.flag("the output quantization flag")
    out_rows = _quantized(r, "output", dim) if quantized and qout else _dense(r, "output", dim)
    if out_rows != (nlabels if model == 3 else nwords):
        raise FastTextFileError(f"the output matrix has {out_rows:,} rows for {nlabels:,} labels "
                                f"and {nwords:,} words")
    if r.pos != r.size:
        raise FastTextFileError(f"{r.size - r.pos:,} bytes after the end of the model (offset {r.pos:,})")
    return FastTextLayout(version=version, dim=dim, model=model, nwords=nwords, nlabels=nlabels,
                          quantized=quantized, input_rows=rows, output_rows=out_rows, size=r.size)


def check_fasttext_file(path: str | Path) -> FastTextLayout:
    """:func:`fasttext_layout` of the file at ``path``; a bad or missing file is one line naming it."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:
                return fasttext_layout(b"")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return fasttext_layout(mm)
    except FastTextFileError as e:
        raise CptkitError(f"{path}: not a usable fastText model: {e}") from None
    except OSError as e:
        raise CptkitError(f"{path}: cannot read the fastText model: {e.strerror or e}") from None


def load_fasttext(path: str | Path) -> Any:
    """Check the model file, then load it with ``fasttext.load_model``."""
    check_fasttext_file(path)
    import fasttext  # deferred: a compiled extension, not needed for --help

    return fasttext.load_model(str(path))
