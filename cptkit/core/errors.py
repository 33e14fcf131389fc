"""User-facing errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import functools
from collections.abc import Callable
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


def print_error(e: CptkitError) -> None:
    """The one line the CLI prints for ``e`` on stderr (``error: ...``, secrets masked)."""
    from rich.text import Text

    from cptkit.core.progress import console  # deferred: rich
    from cptkit.core.redact import redact_text  # deferred: logging, regexes (--help)

    console.print(Text.assemble(("error: ", "bold red"), redact_text(str(e).replace("\n", " "))), soft_wrap=True)


def cli_main(main: Callable[P, int]) -> Callable[P, int]:
    """A ``python -m`` entry point that ends as the ``cptkit`` CLI does on a :class:`CptkitError`: the
    one line of :func:`print_error` (secrets masked), exit code 2, no traceback."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except CptkitError as e:
            print_error(e)
            return e.exit_code

    return run
