"""Method parameters: dataclasses with defaults, built from keyword or ``KEY=VALUE`` strings.

This module converts command-line strings to the declared field types once, rejects unknown
keys naming the valid ones, and checks the limits a field declares (:data:`RANGE`,
:data:`CHOICES`, made with :func:`param`; ``vitbench describe`` shows them). What spans fields
the dataclass checks itself in ``__post_init__`` (raising :class:`~vitbench.errors.ParamError`).
The canonical JSON of a parameter set (:func:`params_json`, the run id's and the store's) reads
back equal (:func:`params_from_json`): tuples stay tuples.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from vitbench.errors import ParamError

#: nan/inf as Python writes them (``nan``, ``-inf``, ``Infinity``): read as JSON's tokens, then refused
_NON_FINITE = re.compile(r"(?<![\w.\"])([+-]?)(nan|inf(?:inity)?)(?![\w.\"])", re.IGNORECASE)


#: field metadata: the one-line meaning ``vitbench describe`` shows
HELP = "help"
#: field metadata: a parameter training does not depend on (:func:`training_params`)
INFERENCE_ONLY = "inference_only"
#: field metadata: a :class:`Range` every number of the field must lie in
RANGE = "range"
#: field metadata: the field's valid values
CHOICES = "choices"


@dataclass(frozen=True)
class Range:
    """The interval a number (or each number of a list or tuple) must lie in; ``None``: unbounded."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


def at_least(low: float) -> Range:
    """``>= low``."""
    return Range(low)


def above(low: float) -> Range:
    """``> low``."""
    return Range(low, low_open=True)


def param(default: Any = dataclasses.MISSING, help: str = "", *, range: Optional[Range] = None,
          choices: Optional[tuple[Any, ...]] = None, default_factory: Any = dataclasses.MISSING,
          why: str = "", inference_only: bool = False) -> Any:
    """A parameter field with its meaning and its limits, checked by :func:`check_limits` when
    the parameters are made and shown by ``vitbench describe``; ``why`` follows a refusal;
    ``inference_only``: training does not depend on it (:func:`training_params`)."""
    metadata: dict[str, Any] = {HELP: help}
    if inference_only:
        metadata[INFERENCE_ONLY] = True
    if range is not None:
        metadata[RANGE] = range
    if choices is not None:
        metadata[CHOICES] = tuple(choices)
    if why:
        metadata["why"] = why
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def limits_text(f: dataclasses.Field) -> str:
    """A field's declared limits in words (``>= 0``, ``one of: a, b``); ``""`` when it has none."""
    words = []
    if RANGE in f.metadata:
        words.append(str(f.metadata[RANGE]))
    if CHOICES in f.metadata:
        words.append("one of: " + ", ".join(map(str, f.metadata[CHOICES])))
    return "; ".join(words)


def _numbers(value: Any) -> list[float]:
    """The numbers a range applies to: the value, or each item of a list or tuple (bools are no number)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]


def check_limits(method: str, values: Mapping[str, Any], fields: tuple[dataclasses.Field, ...]) -> None:
    """Refuse a value outside its field's declared :data:`RANGE` or :data:`CHOICES`, naming the
    method, the parameter, the value and what is valid."""
    for f in fields:
        if f.name not in values:
            continue
        value, meta = values[f.name], f.metadata
        why = f" ({meta['why']})" if meta.get("why") else ""
        if CHOICES in meta and value not in meta[CHOICES]:
            raise ParamError(f"{method}.{f.name}={value!r}; valid values: {', '.join(map(str, meta[CHOICES]))}{why}")
        span = meta.get(RANGE)
        if span is not None and any(number not in span for number in _numbers(value)):
            which = "every item" if isinstance(value, (list, tuple)) else "it"
            shown = list(value) if isinstance(value, tuple) else value
            raise ParamError(f"{method}.{f.name}={shown} is out of range; {which} must be {span}{why}")


class _NonFiniteParam(ParamError):
    """A NaN or infinite float parameter: reported as it is, not as a type mismatch."""


def param_names(params_type: type) -> list[str]:
    """The field names of a parameter dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(params_type)]


def _convert(method: str, key: str, value: Any, hint: Any) -> Any:
    """Convert ``value`` (often a CLI string) to the type ``hint``; raise ParamError if it can't."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    bad = ParamError(f"{method}.{key}={value!r} is not a valid {_hint_name(hint)}")
    if origin is typing.Union or origin is types.UnionType:  # Optional[X], Union[X, Y], X | Y
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            if type(None) in args:
                return None
        others = [arg for arg in args if arg is not type(None)]
        if len(others) == 1 and typing.get_origin(others[0]) in (tuple, list):  # an optional list: its own
            return _convert(method, key, value, others[0])  # message, naming a bad item ("3.5 is not a valid int")
        for arg in _written_container_first(value, args):
            if arg is type(None):
                continue
            try:
                return _convert(method, key, value, arg)
            except _NonFiniteParam:
                raise
            except ParamError:
                continue
        raise bad
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise bad
    if hint is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise bad from None
    if hint is float:
        if isinstance(value, bool):
            raise bad
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise bad from None
        if not math.isfinite(number):
            raise _NonFiniteParam(f"{method}.{key}={value!r} is not a finite number; nan and inf are not "
                                  f"valid values")
        return number
    if hint is str:
        return str(value)
    if origin in (tuple, list):
        items = value
        if isinstance(value, str):
            text = value.strip()
            if (text[:1] in "([" or text[-1:] in ")]") and (text[:1], text[-1:]) not in (("(", ")"), ("[", "]")):
                raise bad  # an unclosed "(13,0.5" is no schedule
            text = _NON_FINITE.sub(_json_non_finite, text)
            try:
                items = json.loads(text if text.startswith("[") else f"[{text.strip('()')}]")
            except json.JSONDecodeError:
                raise bad from None
        if not isinstance(items, (list, tuple)):
            raise bad
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed-length tuple[X, Y]
            if len(items) != len(args):
                raise bad
            item_hints = list(args)
        else:
            item_hints = [args[0] if args else Any] * len(items)
        try:
            converted = [
                item if hint is Any else _convert(method, key, item, hint)
                for item, hint in zip(items, item_hints)
            ]
        except _NonFiniteParam as exc:
            raise _NonFiniteParam(f"{method}.{key}={value!r}: {str(exc).partition('=')[2]}") from None
        return tuple(converted) if origin is tuple else converted
    return value


def _json_non_finite(match: re.Match[str]) -> str:
    """``nan``/``-inf`` -> JSON's ``NaN``/``-Infinity`` (parsed, then refused by the float check)."""
    return "NaN" if match.group(2).lower() == "nan" else f"{'-' if match.group(1) == '-' else ''}Infinity"


def _written_container_first(value: Any, args: tuple[Any, ...]) -> list[Any]:
    """The arms of a Union, those of the container ``value`` is written as tried first.

    So ``"(13, 0)"`` or ``(13, 0)`` picks ``tuple[int, float]`` before ``list[int]`` (tome.r), and
    text written as one kind of container is never read as the other when the hint has both (a
    Python tuple may still be a per-block sequence: a recipe's ``r=(0, 16, ...)``).
    """
    text = value.strip() if isinstance(value, str) else ""
    if isinstance(value, tuple) or text.startswith("("):
        written: Any = tuple
    elif isinstance(value, list) or text.startswith("["):
        written = list
    else:
        return list(args)
    other = list if written is tuple else tuple
    if text and any(typing.get_origin(arg) is written for arg in args):  # the text "(4,)" is no per-block list
        args = tuple(arg for arg in args if typing.get_origin(arg) is not other)
    return sorted(args, key=lambda arg: typing.get_origin(arg) is not written)


def _hint_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def make_params(method: str, params_type: type, overrides: Mapping[str, Any]) -> Any:
    """Build a validated parameter dataclass for ``method`` from ``overrides``.

    Unknown keys and values of the wrong type raise :class:`ParamError` naming the key and the
    valid ones; then each value given is checked against its field's declared limits
    (:func:`check_limits`), and what spans fields is the dataclass's own ``__post_init__``.
    """
    hints = typing.get_type_hints(params_type)
    valid = param_names(params_type)
    kwargs = {}
    for key, value in overrides.items():
        if key not in valid:
            listed = ", ".join(valid) if valid else "(none)"
            raise ParamError(f"unknown parameter {method}.{key}; valid parameters of {method}: {listed}")
        kwargs[key] = _convert(method, key, value, hints[key])
    check_limits(method, kwargs, dataclasses.fields(params_type))
    try:
        return params_type(**kwargs)
    except ParamError:
        raise
    except (TypeError, ValueError) as exc:
        raise ParamError(f"{method}: {exc}") from None


def params_dict(params: Any) -> dict[str, Any]:
    """A JSON-friendly dict of a parameter dataclass instance that :func:`make_params` reads back
    equal: tuples become lists, except in a field that takes a list or a tuple (``tome.r``: a
    per-block list, or ``(r, inflect)``), where the tuple is written as it is typed, ``"(13,0.0)"``."""
    hints = typing.get_type_hints(type(params))
    out = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if isinstance(value, tuple) and _takes_list_and_tuple(hints[f.name]):
            out[f.name] = "(" + ",".join(json.dumps(v) for v in value) + ")"
        else:
            out[f.name] = json.loads(json.dumps(dataclasses.asdict(params)[f.name]))
    return out


def default_params(params_type: type) -> dict[str, Any]:
    """The defaults of a parameter dataclass type, as :func:`params_dict` writes them."""
    return params_dict(params_type())


def _takes_list_and_tuple(hint: Any) -> bool:
    """Whether a Union ``hint`` has both a list arm and a tuple arm (a JSON list would be ambiguous)."""
    arms = {typing.get_origin(arg) for arg in typing.get_args(hint)}
    return list in arms and tuple in arms


def params_json(params: Any) -> str:
    """The canonical JSON of a parameter dataclass instance (sorted keys, :func:`params_dict`):
    the text a run id hashes and the store keeps."""
    return json.dumps(params_dict(params), sort_keys=True)


def params_from_json(method: str, params_type: type, text: str) -> Any:
    """The parameter dataclass instance :func:`params_json` wrote, read back equal (tuples stay tuples)."""
    return make_params(method, params_type, json.loads(text))


def checked(method: str, params: Any) -> Any:
    """A parameter dataclass instance made by hand (``apply(model, "tome", ToMeParams(r=8))``),
    with its declared limits checked as :func:`make_params` checks them."""
    check_limits(method, {f.name: getattr(params, f.name) for f in dataclasses.fields(params)},
                 dataclasses.fields(params))
    return params


def training_params(params_type: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a method's parameters by name) less those declared ``inference_only``: what
    a fine-tuning depends on (shipped weights fit every run that agrees on these)."""
    skip = {f.name for f in dataclasses.fields(params_type) if f.metadata.get(INFERENCE_ONLY)}
    return {k: v for k, v in values.items() if k not in skip}
