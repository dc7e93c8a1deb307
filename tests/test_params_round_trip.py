"""Every built-in method's parameters, in every form ``vitbench describe`` shows, go from the
command line through the run spec and the store and come back equal (docs/guide/methods.md,
"Parameters"): ``--param m.k=TEXT`` -> plan -> the spec's canonical JSON (its id) -> ``runs.jsonl``
-> the dataclass again. A form no value of which the method accepts fails: declare its limits."""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Iterator

import pytest

from vitbench.core.params import CHOICES, RANGE, make_params
from vitbench.errors import ParamError
from vitbench.host import get_host
from vitbench.results.store import ResultStore
from vitbench.run.plan import build_plan

BUILT_IN = "vitbench_plugins"
#: what a parameter needs beside it, given the text of its value (it spans fields)
COMPANIONS = {
    ("ltm", "num_clusters"): lambda text: {"clusters": "kmeans"},
    ("dcs", "num_clusters"): lambda text: {"clusters": "kmeans"},
    ("diffrate", "prune_kept"): lambda text: {"merge_kept": text},  # prune[0] >= merge[0] >= prune[1] ...
    ("diffrate", "merge_kept"): lambda text: {"prune_kept": text},
}


def _built_in_methods() -> list[str]:
    host = get_host()
    return [name for name in host.names("methods") if host.owner("methods", name) in _built_in_plugins()]


def _built_in_plugins() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="vitbench") if ep.value.startswith(BUILT_IN)}


def _forms(hint: Any) -> list[Any]:
    """The arms describe shows: ``int | list[int] | (int, float)`` -> three forms."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return list(typing.get_args(hint))
    return [hint]


def _numbers(kind: type, field: dataclasses.Field, default: Any) -> list[Any]:
    span = field.metadata.get(RANGE)
    picks = [default] if type(default) is kind else []
    if span is not None and span.low is not None:
        picks += [span.low, span.low + 1] if not span.low_open else [span.low + 0.5, span.low + 1]
    picks += [1, 2, 0, 0.5, 0.25, 3]
    return [kind(v) for v in picks if kind is float or float(v).is_integer()]


def _samples(form: Any, field: dataclasses.Field, default: Any) -> Iterator[Any]:
    """Values of ``form`` to try, those a method most likely accepts first."""
    origin, args = typing.get_origin(form), typing.get_args(form)
    if form is type(None):
        yield None
    elif form is bool:
        yield from (not default, bool(default))
    elif form in (int, float):
        yield from _numbers(form, field, default)
    elif form is str:
        yield from field.metadata.get(CHOICES, ()) or (default,)
    elif origin is tuple and args and args[-1] is not Ellipsis:  # (r, inflect)
        for first, second in zip(_numbers(args[0], field, None), [0.0, -0.5, 0.5, 1.0, 0.25, 0.0]):
            yield (first, second) if len(args) == 2 else tuple([first] * len(args))
    elif origin in (tuple, list):
        item = args[0] if args else int
        if isinstance(default, origin) and default:
            yield default
        numbers = _numbers(item, field, None)
        for n in numbers:
            yield origin([n, n + 1]) if item is int else origin([n])
        for n in numbers:
            yield origin([n + 1, n]) if item is int else origin([n])  # counts that never increase
    else:
        yield default


def _written(value: Any) -> str:
    """``value`` as a user writes it after ``--param m.k=``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "(" + ",".join(_written(v) for v in value) + ")"
    if isinstance(value, list):
        return "[" + ",".join(_written(v) for v in value) + "]"
    return str(value)


def _cases() -> list[tuple[str, str, str]]:
    host = get_host()
    cases = []
    for method in _built_in_methods():
        params = host.method(method).params
        hints = typing.get_type_hints(params)
        for f in dataclasses.fields(params):
            for form in _forms(hints[f.name]):
                cases.append((method, f.name, getattr(form, "__name__", None) or str(form)))
    return cases


@pytest.mark.parametrize("method, key, form", _cases())
def test_each_form_round_trips_through_the_run_spec_and_the_store(method, key, form, tmp_path) -> None:
    spec = get_host().method(method)
    hints = typing.get_type_hints(spec.params)
    field = next(f for f in dataclasses.fields(spec.params) if f.name == key)
    arm = next(a for a in _forms(hints[key]) if (getattr(a, "__name__", None) or str(a)) == form)
    default = getattr(make_params(method, spec.params, {}), key)
    tried = []
    for value in _samples(arm, field, default):
        text = _written(value)
        given_text = {key: text, **COMPANIONS.get((method, key), lambda text: {})(text)}
        try:
            given = make_params(method, spec.params, given_text)
        except ParamError as exc:
            tried.append(f"{text}: {exc}")
            continue
        assert getattr(given, key) == value and type(getattr(given, key)) is type(value), text
        baseline, run = build_plan(task="cls", model="deit_tiny_patch16_224", methods=[method], data=None,
                                   overrides={method: given_text}, metrics=["gmacs"], batch_size=1,
                                   device="cpu", seed=0)
        assert run.values == given  # the spec's own JSON, read back by the dataclass
        store = ResultStore(tmp_path)
        store.append({"spec_id": run.spec_id, "status": "ok", "task": run.task, "model": run.model, "method": method,
                      "params": run.params})
        (record,) = ResultStore(tmp_path).records()
        assert make_params(method, spec.params, record["params"]) == given
        assert json.loads(run.params_json) == record["params"]
        return
    pytest.fail(f"{method}.{key} as {form}: no value tried was accepted ({'; '.join(tried)})")
