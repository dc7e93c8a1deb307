"""Tell a real Ctrl-C from a ``KeyboardInterrupt`` that plugin code raised itself.

Plugin code fails alone (:data:`~vitbench.errors.PLUGIN_FAILURES`), but a person pressing Ctrl-C
must still stop the plan. The CLI installs :func:`watch_ctrl_c`'s SIGINT handler, which notes the
signal before raising; a guard around plugin code asks :func:`is_ctrl_c` which one it caught.
"""
from __future__ import annotations

import signal
from types import FrameType
from typing import Any, Optional

__all__ = ["is_ctrl_c", "watch_ctrl_c"]

_pressed = False


def _on_sigint(signum: int, frame: Optional[FrameType]) -> None:
    global _pressed
    _pressed = True
    raise KeyboardInterrupt


def watch_ctrl_c() -> Any:
    """Install the SIGINT handler that notes a real Ctrl-C; returns the handler it replaced
    (``None`` outside the main thread, where nothing is installed)."""
    global _pressed
    _pressed = False
    try:
        return signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        return None


def is_ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc``, caught around plugin code, must stop the plan: a ``KeyboardInterrupt``
    after SIGINT arrived, or any ``KeyboardInterrupt`` where no watcher can tell (the Python API)."""
    if not isinstance(exc, KeyboardInterrupt):
        return False
    return _pressed or signal.getsignal(signal.SIGINT) is not _on_sigint
