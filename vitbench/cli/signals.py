"""SIGTERM ends a command as Ctrl-C does: the run in progress is dropped, finished runs stay in
the store, and one line says so (exit 143, the shell's code for a SIGTERM)."""
from __future__ import annotations

import signal
from types import FrameType
from typing import Optional

__all__ = ["Terminated", "raise_on_sigterm"]


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM (a scheduler's kill, ``kill PID``)."""


def _raise(signum: int, frame: Optional[FrameType]) -> None:
    raise Terminated(signum)


def raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` (only where this is the main thread)."""
    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: leave the default handler
        pass
