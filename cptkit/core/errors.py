"""User-facing errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import ParamSpec

P = ParamSpec("P")


class CptkitError(Exception):
    """Bad input or bad configuration: reported without a traceback."""

    exit_code = 2


class BadInput(CptkitError):
    """A malformed input record, named by file and line."""

    def __init__(self, path: str, line: int | None, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")


# a place that cannot be read or written as asked (an OSError naming it): one line, not a traceback
PLACE_ERRNOS = {errno.EROFS: "read-only file system", errno.ENOTDIR: "not a directory",
                errno.EISDIR: "is a directory", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted"}


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust library's panic (pyo3's ``pyo3_runtime.PanicException``: a
    ``BaseException``, so ``except Exception`` lets it through)."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


_PANIC_HEAD = re.compile(rb"thread '[^'\n]*'(?: \(\d+\))? panicked at ")


def drop_panic_notices(text: bytes) -> bytes:
    """``text`` (what went to stderr) less the notices Rust's panic hook prints: the ``thread '...'
    panicked at ...`` line, its message line, and the backtrace and ``note:`` lines after it."""
    out: list[bytes] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not _PANIC_HEAD.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        if out and not out[-1].strip():  # the hook's blank line before the notice
            out.pop()
        i += 2  # the notice's first line and its message
        while i < len(lines) and (lines[i].startswith((b"note: ", b" ")) or lines[i].rstrip() == b"stack backtrace:"):
            i += 1
    return b"".join(out)


@contextlib.contextmanager
def quiet_panics() -> Iterator[None]:
    """Run the block with the process's stderr (fd 2) held in a temporary file, then write it back less
    the notices of Rust panics (:func:`drop_panic_notices`): a library's panic (``PanicException``,
    :func:`is_panic`) is then reported by the caller as one line, not also as the Rust hook's notice
    and backtrace. What else the block (or another thread meanwhile) writes to stderr comes out at
    its end."""
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(2)
    held = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    try:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            held.seek(0)
            rest = memoryview(drop_panic_notices(held.read()))
            while rest:
                rest = rest[os.write(2, rest):]
    finally:
        os.close(saved)
        held.close()


def print_error(e: CptkitError) -> None:
    """The one line the CLI prints for ``e`` on stderr (``error: ...``, secrets masked)."""
    from rich.text import Text

    from cptkit.core.progress import console  # deferred: rich
    from cptkit.core.redact import redact_text  # deferred: logging, regexes (--help)

    console.print(Text.assemble(("error: ", "bold red"), redact_text(str(e).replace("\n", " "))), soft_wrap=True)


def cli_main(main: Callable[P, int]) -> Callable[P, int]:
    """A module's ``main(argv)`` (run by its ``cptkit`` subcommand) that ends as a step does on a
    :class:`CptkitError`: the one line of :func:`print_error` (secrets masked), exit code 2, no traceback."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except CptkitError as e:
            print_error(e)
            return e.exit_code

    return run
