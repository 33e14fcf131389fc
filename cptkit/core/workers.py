"""Local worker processes: one fork pool for the frame (tasks of a run, members of a wave).

:func:`in_workers` runs ``fn(item)`` for every item in this process (one worker) or in up to N
forked processes. A forked worker sees its parent's state as of the fork (loaded models, compiled
kernels, the run's output lock: its temporary files name the parent, a live writer) and returns
a picklable value; a :class:`cptkit.core.errors.CptkitError` it raises is raised again in the
parent. Forked workers start with SIGTERM's default action (:mod:`cptkit.core.signals`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from cptkit.core.errors import BadInput, CptkitError

T = TypeVar("T")
V = TypeVar("V")

_WORK: tuple[Callable, Sequence] | None = None  # what a forked worker runs; set before the fork


def n_workers(workers: int, items: int) -> int:
    """Processes for ``items`` items with ``workers`` asked for (0: one per CPU)."""
    return max(1, min(workers or os.cpu_count() or 1, items))


class _Failed:
    """A worker's cptkit error, as a value (``BadInput`` itself does not unpickle)."""

    def __init__(self, e: CptkitError):
        self.args = (e.path, e.line, e.reason) if isinstance(e, BadInput) else (str(e),)

    def error(self) -> CptkitError:
        return BadInput(*self.args) if len(self.args) == 3 else CptkitError(*self.args)


def _forked(k: int) -> tuple[int, Any]:
    """In a worker: run item ``k``."""
    fn, items = _WORK  # type: ignore[misc]
    try:
        return k, fn(items[k])
    except CptkitError as e:
        return k, _Failed(e)


def in_workers(workers: int, items: Sequence[T], fn: Callable[[T], V],
               init: Callable[[], None] | None = None) -> Iterator[tuple[T, V]]:
    """``(item, fn(item))`` for every item: in this process, in order, with one worker; else in up to
    ``workers`` forked processes (0: one per CPU), in completion order, each running ``init()`` first.
    ``fn`` sees this process's state as of the fork and returns a picklable value."""
    global _WORK
    n = n_workers(workers, len(items))
    if n <= 1:
        for item in items:
            yield item, fn(item)
        return
    _WORK = (fn, items)
    try:
        with mp.get_context("fork").Pool(n, initializer=init) as pool:
            for k, out in pool.imap_unordered(_forked, range(len(items))):
                if isinstance(out, _Failed):
                    raise out.error()
                yield items[k], out
    finally:
        _WORK = None
