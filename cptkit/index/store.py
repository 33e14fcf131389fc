"""An index directory: BM25 postings plus the documents themselves, built once and memory-mapped.

``DIR/index.json`` (written last: its presence marks a finished index) holds the format
version, document/term/posting counts, BM25 parameters, the tokenizer config, the corpus files
it was built from and the build time. ``DIR/docs.jsonl`` holds every document as one compact
JSON line and ``DIR/doc_offsets.npy`` (int64, docs + 1) their byte offsets, so a search can
emit full records from the index alone. The postings are :mod:`cptkit.index.bm25`'s files.
An index is built in a hidden sibling directory and renamed into place when complete.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record, dumps
from cptkit.index.base import BM25Params, Searcher
from cptkit.index.bm25 import BM25Builder, BM25Index
from cptkit.index.rank_bm25_backend import RankBM25Searcher
from cptkit.text.tokenize import Tokenizer

FORMAT = 1
META = "index.json"
BACKENDS = ("bm25", "rank_bm25")


def is_finished(directory: str | Path) -> bool:
    return (Path(directory) / META).is_file()


def dir_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in Path(directory).iterdir() if f.is_file())


def remove_stale_builds(final: Path) -> list[Path]:
    """Remove ``.NAME.building-PID`` directories of killed builds (their process is gone)."""
    removed = []
    for d in final.parent.glob(f".{final.name}.building-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still building
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def build_index(records: Iterable[Record], directory: str | Path, tokenizer: Tokenizer, params: BM25Params, *,
                dtype: str = "float32", text_field: str = "text", sources: list[dict] | None = None,
                on_record: Callable[[], None] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Tokenize and store ``records``, build postings, write the index to ``directory`` atomically.

    Holds the postings in memory while building (about 12 bytes per distinct term per document);
    the documents stream to disk. Returns the index metadata.
    """
    final = Path(directory)
    if final.exists() and any(final.iterdir()) and not is_finished(final):
        raise CptkitError(f"{final}: exists and is not a cptkit index; refusing to build into it")
    remove_stale_builds(final)
    tmp = final.parent / f".{final.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.time()
    try:
        builder = BM25Builder()
        offsets = [0]
        with_text = 0  # documents whose text_field is a string
        with open(tmp / "docs.jsonl", "wb") as fh:
            for rec in records:
                line = (dumps(rec) + "\n").encode("utf-8")
                fh.write(line)
                offsets.append(offsets[-1] + len(line))
                text = rec.get(text_field)
                with_text += isinstance(text, str)
                builder.add(tokenizer(text) if isinstance(text, str) else [])
                if on_record is not None:
                    on_record()
        if builder.n_docs == 0:
            raise CptkitError("the corpus holds no documents")
        if with_text == 0:
            files = ", ".join(str(s.get("path")) for s in sources or []) or "the corpus"
            raise CptkitError(f"retrieve.text_field={text_field!r}: no document of {files} has a string "
                              f"{text_field!r} field, so every document would be empty")
        np.save(tmp / "doc_offsets.npy", np.asarray(offsets, dtype=np.int64))
        index = builder.finish(params, dtype)
        index.save(tmp)
        meta = {"format": FORMAT, **index.stats(), "params": params.as_dict(), "tokenizer": tokenizer.config(),
                "text_field": text_field, "sources": sources or [], "build_seconds": time.time() - t0,
                **(extra or {})}
        meta["size_bytes"] = dir_size(tmp)
        (tmp / META).write_text(json.dumps(meta, indent=2, ensure_ascii=False))
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


class DocStore:
    """The stored documents, memory-mapped: ``store.raw(i)`` (bytes) or ``store.record(i)``."""

    def __init__(self, directory: Path):
        self.offsets = np.load(directory / "doc_offsets.npy", mmap_mode="r")
        self._fh = open(directory / "docs.jsonl", "rb")  # noqa: SIM115
        size = os.fstat(self._fh.fileno()).st_size
        self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def raw(self, i: int) -> bytes:
        return self._mm[int(self.offsets[i]):int(self.offsets[i + 1])]

    def record(self, i: int) -> Record:
        return json.loads(self.raw(i))

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._fh.close()


class OpenIndex:
    """A finished index directory opened for search (arrays memory-mapped)."""

    def __init__(self, directory: str | Path, mmap_arrays: bool = True):
        self.dir = Path(directory)
        if not is_finished(self.dir):
            raise CptkitError(f"{self.dir}: no finished index here ({META} missing)")
        self.meta = json.loads((self.dir / META).read_text())
        if self.meta.get("format") != FORMAT:
            raise CptkitError(f"{self.dir}: index format {self.meta.get('format')} is not {FORMAT}; rebuild it")
        self.tokenizer = Tokenizer(self.meta["tokenizer"])
        self.bm25 = BM25Index.load(self.dir, mmap=mmap_arrays)
        self.docs = DocStore(self.dir)

    @property
    def n_docs(self) -> int:
        return self.bm25.n_docs

    def searcher(self, backend: str = "bm25", params: BM25Params | None = None) -> Searcher:
        """The fast backend (scores recomputed if ``params`` differ from the build's) or rank_bm25."""
        params = params or self.bm25.params
        if backend == "bm25":
            return self.bm25.with_params(params)
        if backend == "rank_bm25":
            field = self.meta.get("text_field", "text")
            toks = []
            for i in range(self.n_docs):
                text = self.docs.record(i).get(field)
                toks.append(self.tokenizer(text) if isinstance(text, str) else [])
            return RankBM25Searcher(toks, params)
        raise CptkitError(f"retrieve.backend must be one of {BACKENDS}, got {backend!r}")

    def close(self) -> None:
        self.docs.close()
