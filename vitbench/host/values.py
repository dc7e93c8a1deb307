"""A run's method parameters parsed once: each method's ``--param`` values (or the API's
keywords) become its validated parameter dataclass here, and that instance travels as it is to
the plan, the run spec and :func:`~vitbench.apply` (docs/architecture.md, "How a run flows").
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vitbench.core.params import checked, make_params
from vitbench.errors import ParamError, VitbenchError
from vitbench.host import get_host

__all__ = ["method_values", "values_of"]


def method_values(methods: Iterable[str], given: Mapping[str, Any], *, matched: bool = False) -> dict[str, Any]:
    """Each of ``methods`` by its registered name, in order, with its validated parameter dataclass.

    ``given`` maps a method's name or alias to its values, ``{"tome": {"r": "8"}}`` (an alias's
    and the name's are merged; one key given twice differently is refused), or to an instance of
    its parameter dataclass, which is taken as it is once its limits are checked. A name that is
    not among ``methods`` is refused, naming those that are; with ``matched`` (``--match-gmacs``,
    a sweep's budgets) so is a value for a method's budget knob, which the run chooses."""
    host = get_host()
    names = list(dict.fromkeys(host.method(name).name for name in methods))  # unknown -> the valid ones
    merged: dict[str, dict[str, Any]] = {}
    parsed: dict[str, Any] = {}
    for typed, values in given.items():
        spec = host.method(typed)
        if spec.name not in names:
            raise VitbenchError(f"--param names method {typed!r}, which is not in --methods "
                                f"({', '.join(names) or 'none'})")
        if isinstance(values, spec.params):
            parsed[spec.name] = checked(spec.name, values)
            continue
        if not isinstance(values, Mapping):
            raise ParamError(f"the parameters of {typed} are a {type(values).__name__}; give a dict of values "
                             f"({{'key': value}}) or a {spec.params.__name__}")
        knob = spec.budget.param if matched and spec.budget is not None else None
        if knob is not None and knob in values:
            raise ParamError(f"--param {spec.name}.{knob} conflicts with matched compute: {knob} is {spec.name}'s "
                             f"budget knob, which --match-gmacs/--budgets sets; leave it out")
        own = merged.setdefault(spec.name, {})
        for key, value in values.items():
            if key in own and own[key] != value:
                raise ParamError(f"--param {spec.name}.{key} is given twice, as {own[key]!r} and {value!r} "
                                 f"(through the alias {typed!r}); give it once")
            own[key] = value
    both = sorted(set(parsed) & set(merged))
    if both:
        raise ParamError(f"{both[0]}: give its parameters as a {host.method(both[0]).params.__name__} or as "
                         f"values, not both")
    return {name: parsed[name] if name in parsed else make_params(name, host.method(name).params, merged.get(name, {}))
            for name in names}


def values_of(method: str, given: Any) -> Any:
    """One method's validated parameter dataclass, from its values or an instance
    (:func:`method_values` of that method alone)."""
    return next(iter(method_values([method], {method: given}).values()))
