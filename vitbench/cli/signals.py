"""SIGTERM ends a command as Ctrl-C does: the run in progress is dropped, finished runs stay in
the store, and one line says so (exit 143, the shell's code for a SIGTERM)."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Optional

from vitbench.core.interrupts import watch_ctrl_c

__all__ = ["Terminated", "signals_as_exceptions"]


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM (a scheduler's kill, ``kill PID``)."""


def _raise(signum: int, frame: Optional[FrameType]) -> None:
    raise Terminated(signum)


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` and SIGINT a ``KeyboardInterrupt`` noted
    as a real Ctrl-C (:mod:`vitbench.core.interrupts`); the previous handlers come back after it, so an
    in-process caller (a test, a notebook) keeps its own. Outside the main thread: nothing changes."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: leave the default handlers
        yield
        return
    previous_int = watch_ctrl_c()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
