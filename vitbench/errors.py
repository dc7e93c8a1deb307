"""Errors that the CLI turns into one clear line (no traceback).

Every error raised for bad user input is a :class:`VitbenchError`. Its message names the bad
value and, where there is a closed set of valid values, lists them (see :func:`choices_error`).
"""
from __future__ import annotations

from collections.abc import Iterable


class VitbenchError(Exception):
    """Base class of every error caused by the user's input or environment."""


class UnknownNameError(VitbenchError, KeyError):
    """An unknown method, scorer, task, model, family or metric name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ParamError(VitbenchError, ValueError):
    """A method parameter of the wrong type or out of range."""


class UnsupportedError(VitbenchError):
    """A method that does not support the given backbone family."""


class BudgetError(VitbenchError):
    """A compute budget a method cannot be matched to: it declares no budget knob ("not
    matchable"), or no knob setting lands within the tolerance of the budget."""


class DataError(VitbenchError):
    """A missing or malformed data folder."""


class CheckpointError(VitbenchError):
    """A checkpoint that cannot be read."""


class PluginError(VitbenchError):
    """A plugin that failed to load, or two plugins that register the same name."""


class NonFiniteError(VitbenchError):
    """A loss, gradient, model output or metric that became NaN or infinite.

    Raised instead of letting a diverged fine-tuning or a broken forward turn into a 0.00 %
    row: the run is recorded as ``error`` with this message (what became non-finite, where).
    """


class TokenRuleError(VitbenchError):
    """A reduction step that breaks a token rule (docs/token-state.md): it drops, moves or changes
    a prefix token, grows the sequence, or leaves the token state counting other tokens than it
    returns. A bug in the method: the run is recorded as ``error`` with this message (the
    method, the block and the rule). ``rule`` is the rule's short name."""

    def __init__(self, message: str, *, rule: str = "", block: object = None) -> None:
        super().__init__(message)
        self.rule, self.block = rule, block


def choices_error(kind: str, value: object, valid: Iterable[str]) -> UnknownNameError:
    """Return an :class:`UnknownNameError` for ``value`` that lists the valid ``kind`` names."""
    names = sorted(set(valid))
    listed = ", ".join(names) if names else "(none registered)"
    return UnknownNameError(f"unknown {kind} {value!r}; valid {kind}s: {listed}")


#: what plugin code may raise that fails only that plugin or run (a real Ctrl-C: ``interrupts``)
PLUGIN_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)


def failure_text(exc: BaseException) -> str:
    """One line for an exception plugin code raised (``SystemExit`` says who exited)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: plugin code called sys.exit({exc.code!r})"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt: raised by plugin code, not by Ctrl-C"
    return f"{type(exc).__name__}: {exc}"
