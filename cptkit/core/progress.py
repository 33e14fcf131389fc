"""Progress bars and summary tables on stderr (never stdout, which may carry data).

On a terminal, live Rich bars and Rich log records; when stderr is not a terminal (a log file, a
batch job), plain one-line log records and one log line per bar every
``CPTKIT_PROGRESS_INTERVAL`` seconds (default 30) instead.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from cptkit.core.redact import RedactingFilter, install_log_redaction

console = Console(stderr=True)
log = logging.getLogger("cptkit")


class PlainHandler(logging.StreamHandler):
    """One unwrapped line per record (``LEVEL    message``) on the current ``sys.stderr``: what a
    log file, a batch job's output or CI needs (grep-able; Rich would wrap at 80 columns)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - sys.stderr as it is now (pytest's capture, a redirect)
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001 - StreamHandler.__init__ assigns it
        pass


def setup_logging(quiet: bool = False) -> None:

    install_log_redaction()

    # Libraries' own tqdm bars (model loading, GGUF conversion) would interleave with ours.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if not log.handlers:
        handler: logging.Handler = (RichHandler(console=console, show_path=False, show_time=False, markup=False)
                                    if console.is_terminal else PlainHandler())
        handler.addFilter(RedactingFilter())
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.INFO)


class LoggedProgress(Progress):
    """Rich progress that, off a terminal, logs each bar's state at an interval instead of drawing."""

    def __init__(self, *columns: Any, interval: float, **kw: Any):
        super().__init__(*columns, **kw)
        self.interval = interval
        self._last: dict[Any, float] = {}

    def update(self, task_id: Any, **kw: Any) -> None:  # type: ignore[override]
        super().update(task_id, **kw)
        now = time.monotonic()
        if now - self._last.setdefault(task_id, now) < self.interval:
            return
        self._last[task_id] = now
        t = self._tasks[task_id]
        done = f"{t.completed:,.0f}" + (f"/{t.total:,.0f} ({100 * t.completed / t.total:.0f}%)" if t.total else "")
        rate = f", {t.speed:,.1f}/s" if t.speed else ""
        eta = f", ~{t.time_remaining:,.0f} s left" if t.time_remaining is not None else ""
        log.info("%s: %s, %.0f s elapsed%s%s", t.description, done, t.elapsed or 0.0, rate, eta)


def make_progress(quiet: bool = False) -> Progress:
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    if not quiet and not console.is_terminal:
        interval = float(os.environ.get("CPTKIT_PROGRESS_INTERVAL", "30"))
        return LoggedProgress(*columns, interval=interval, console=console, disable=True, transient=False)
    return Progress(*columns, console=console, disable=quiet, transient=False)


def summary_table(title: str, rows: Mapping[str, Any]) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
        elif isinstance(value, int):
            value = f"{value:,}"
        table.add_row(escape(str(key)), escape(str(value)))
    return table


def print_summary(title: str, rows: Mapping[str, Any], quiet: bool = False) -> None:
    if not quiet:
        console.print(summary_table(title, rows))
