"""``vitbench.apply(model, "tome", r=13)``: a method applied to a timm model in one line."""
from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import nn

from vitbench.errors import PLUGIN_FAILURES, ParamError, UnsupportedError, VitbenchError
from vitbench.core.interrupts import is_ctrl_c
from vitbench.catalog import FamilySpec, MethodSpec, missing_capabilities
from vitbench.core.params import checked
from vitbench.engine.reducer import reduction_needs
from vitbench.host import get_host
from vitbench.host.values import values_of
from vitbench.task import REFERENCES

if TYPE_CHECKING:  # pragma: no cover
    from vitbench.host.spec import RunSpec

__all__ = ["apply", "check_applies"]


def apply(model: nn.Module, method: str, params: Any = None, /, **overrides: Any) -> nn.Module:
    """Reduce ``model`` in place with the registered ``method`` and return it.

    The parameters come as the method's parameter dataclass, taken as it is (``apply(model,
    "tome", ToMeParams(r=8))``; a run spec's :attr:`~vitbench.host.spec.RunSpec.values`), or as
    keywords made into it (``apply(model, "tome", r=8)``). Either way unknown keys, wrong types
    and values outside a field's declared limits raise :class:`~vitbench.errors.ParamError`; a
    method that does not support the model's family raises :class:`~vitbench.errors.UnsupportedError`.
    """
    host = get_host()
    spec = host.method(method)
    family = host.family_of(model)
    _refuse_missing(spec, family, missing_capabilities(spec, family), type(model).__name__)
    values = _values(spec, params, overrides)
    info = family.describe(model)
    reduction = spec.build(values, info)
    _refuse_missing(spec, family, reduction_needs(reduction) - family.provides, type(model).__name__)
    return family.patch(model, reduction, method=spec.name, params=values)


def _refuse_missing(spec: MethodSpec, family: FamilySpec, missing: frozenset[str], model: str) -> None:
    """Refuse, in one line, a method that needs what the model's family does not provide."""
    if missing:
        runs_on = ", ".join(get_host().families_for(spec)) or "(no registered family)"
        raise UnsupportedError(
            f"method {spec.name!r} needs {', '.join(sorted(missing))}, which the {family.name!r} family ({model}) does "
            f"not provide; {spec.name} runs on: {runs_on} (`vitbench list families` says what each provides)")


def _values(spec: Any, params: Any, overrides: dict[str, Any]) -> Any:
    """The method's parameter dataclass: ``params`` checked, or made from ``overrides``."""
    if params is None:
        return values_of(spec.name, overrides)
    if overrides:
        raise ParamError(f"{spec.name}: give the parameters as a {spec.params.__name__} or as keywords, not both")
    if not isinstance(params, spec.params):
        raise ParamError(f"{spec.name} takes its parameters as a {spec.params.__name__}, not a {type(params).__name__}")
    return checked(spec.name, params)


def check_applies(plan: Iterable[RunSpec], model: Any, *, isolated: bool = False) -> None:
    """Check, before anything runs, that a model-family adapter recognises ``model`` and that
    every method of ``plan`` applies to a copy of it: unsupported pairs and out-of-range
    parameters (e.g. a block index the model lacks) fail here with a clear error. With
    ``isolated`` (``--isolate``), only vitbench's own methods are built here: another
    distribution's code runs in its run's process alone, where a crash is that run's record."""
    host = get_host()
    host.family_of(model)
    checked: set[tuple[str, str]] = set()
    for spec in plan:
        if spec.method in REFERENCES or (spec.method, spec.params_json) in checked:
            continue  # the baseline, or the same method checked for an earlier seed
        if isolated and not host.is_builtin("methods", spec.method):
            continue
        checked.add((spec.method, spec.params_json))
        try:
            apply(copy.deepcopy(model), spec.method, spec.values)
        except VitbenchError:
            raise
        except PLUGIN_FAILURES as exc:
            if is_ctrl_c(exc):
                raise
            continue  # the method's own code failed (sys.exit() too): its runs record it, the others run
