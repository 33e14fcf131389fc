"""Progress bars and summary tables on stderr (never stdout, which may carry data)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

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

T = TypeVar("T")
console = Console(stderr=True)
log = logging.getLogger("cptkit")


def setup_logging(quiet: bool = False) -> None:
    import os

    # Libraries' own tqdm bars (model loading, GGUF conversion) would interleave with ours.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if not log.handlers:
        handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.INFO)


def make_progress(quiet: bool = False) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )


def track(items: Iterable[T], description: str, total: int | None = None, quiet: bool = False) -> Iterator[T]:
    """Iterate with a progress bar (for work that is not record reading)."""
    with make_progress(quiet) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)


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
