"""The Python API's keywords checked against :class:`~vitbench.core.options.RunOptions`' declared
types before anything runs, in the command line's words: ``methods=5`` is one
:class:`~vitbench.errors.VitbenchError` naming the option, the value and what it takes, never a
``TypeError`` from deep inside a run."""
from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from typing import Any

from vitbench.errors import VitbenchError
from vitbench.core.options import RunOptions

__all__ = ["check_option_types", "split_numbers"]

#: options whose command-line spelling is not ``--`` and the name
_FLAGS = {"params": "--param METHOD.KEY=VALUE", "task_options": "task options such as --detector-epochs",
          "controls": "--no-controls", "budgets": "--budgets", "shard": "--shard I/N"}


def _is(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the type ``hint`` (the forms RunOptions declares)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin is typing.Union:
        return any(_is(value, arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is os.PathLike or getattr(hint, "__name__", "") == "Path":
        return isinstance(value, os.PathLike)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_is(item, args[0]) for item in value)
        return len(value) == len(args) and all(_is(item, a) for item, a in zip(value, args))
    if origin is Mapping or hint is Mapping:
        return isinstance(value, Mapping)
    return isinstance(value, origin or hint)


def _words(hint: Any) -> str:
    """What ``hint`` takes, in words: ``a list of names``, ``an integer or None``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        parts = [_words(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(parts)) + (" or None" if type(None) in args else "")
    if origin is tuple:
        item = _words(args[0]).removeprefix("a ").removeprefix("an ")
        return f"a list of {item}s" if args[-1] is Ellipsis else f"a pair of {item}s"
    return {bool: "True or False", int: "an integer", float: "a number", str: "a text"}.get(
        hint, "a mapping" if origin is Mapping or hint is Mapping else "a path")


def check_option_types(function: str, values: Mapping[str, Any]) -> None:
    """Raise a one-line :class:`VitbenchError` for the first of ``values`` (RunOptions keywords,
    lists already tuples) whose type is not the one RunOptions declares."""
    hints = typing.get_type_hints(RunOptions)
    for name, value in values.items():
        if name in hints and not _is(value, hints[name]):
            flag = _FLAGS.get(name, f"--{name.replace('_', '-')}")
            raise VitbenchError(f"vitbench.{function}: {name}={value!r} is not {_words(hints[name])} "
                                f"(the command line's {flag})")


def split_numbers(function: str, name: str, text: str, kind: type) -> tuple[Any, ...]:
    """``"0,1"`` as ``(0, 1)`` (``kind`` int or float), as the command line reads ``--seeds 0,1``."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        return tuple(kind(item) for item in items)
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise VitbenchError(f"vitbench.{function}: {name}={text!r} is not a comma-separated list of {what}") from None
