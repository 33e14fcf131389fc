"""SIGTERM during a run unwinds it as Ctrl-C does (:class:`Terminated`), and the CLI says what was kept.

A run entering its output (:class:`cptkit.core.job.Job`) calls :func:`catch_sigterm` and
:func:`remember` (how to say what it kept); :func:`interrupted_message` and
:func:`interrupted_exit_code` are the CLI's one line and exit status (130 for Ctrl-C, 143 for SIGTERM).
A worker forked during a run starts with SIGTERM's default action, so ``Pool.terminate`` kills it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

_KEPT: list[Callable[[str], str]] = []  # how the run this process entered last says what it kept
_SIGNALLED: list[int] = []  # SIGTERM, once it stopped this process's run
_TERM_OWNER: list[int] = [0]  # the process whose run installed _on_sigterm
_FORK_MASK: list[set] = []  # the signal mask of the thread forking, while SIGTERM is held across a fork


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run: unwound as Ctrl-C is (temporary files removed, finished tasks kept);
    the CLI reports it in one line and exits 143 (:func:`interrupted_exit_code`)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _TERM_OWNER[0]:  # a forked worker (it inherited the handler): die as SIGTERM does
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _SIGNALLED[:] = [signum]
    raise Terminated


def _before_fork() -> None:
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        _FORK_MASK[:] = [signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})]


def _after_fork_in_parent() -> None:
    if _FORK_MASK:
        signal.pthread_sigmask(signal.SIG_SETMASK, _FORK_MASK.pop())


def _after_fork_in_child() -> None:
    if _FORK_MASK:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, _FORK_MASK.pop())


# A worker forked during a run (core/workers.py) starts with SIGTERM's default action: Pool.terminate
# kills it at once, even a moment after its fork (a Python handler could lose that signal there).
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def remember(kept: Callable[[str], str]) -> None:
    """A run starts: ``kept(what)`` will say what it kept if it is interrupted."""
    _KEPT[:] = [kept]
    _SIGNALLED.clear()


def catch_sigterm() -> Any:
    """SIGTERM raises :class:`Terminated` in this process while the run lasts (unless the program
    handles SIGTERM itself, or this is not the main thread). Returns the handler to restore (or None)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        _TERM_OWNER[0] = os.getpid()
        return signal.signal(signal.SIGTERM, _on_sigterm)
    return None


def restore_sigterm(previous: Any) -> None:
    """Put back the handler :func:`catch_sigterm` replaced."""
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit_code() -> int:
    """The CLI's exit status for an interrupted run: 143 (128 + SIGTERM) or 130 (Ctrl-C)."""
    return 128 + _SIGNALLED[0] if _SIGNALLED else 130


def interrupted_message() -> str:
    """What a SIGINT or SIGTERM left on disk and how to resume (for the CLI's exit 130 or 143)."""
    what = "terminated (SIGTERM)" if _SIGNALLED else "interrupted"
    return _KEPT[0](what) if _KEPT else what
