"""``vitbench.apply(model, "tome", r=13)``: a method applied to a timm model in one line."""
from __future__ import annotations

from typing import Any

from torch import nn

from vitbench.errors import UnsupportedError
from vitbench.params import make_params
from vitbench.plugins import get_host


def apply(model: nn.Module, method: str, **params: Any) -> nn.Module:
    """Reduce ``model`` in place with the registered ``method`` and return it.

    Parameters are validated against the method's parameter dataclass (unknown keys, wrong
    types and out-of-range values raise :class:`~vitbench.errors.ParamError`); a method that
    does not support the model's family raises :class:`~vitbench.errors.UnsupportedError`.
    """
    host = get_host()
    spec = host.method(method)
    family = host.family_of(model)
    if family.name not in spec.families:
        raise UnsupportedError(
            f"method {spec.name!r} does not support the {family.name!r} family "
            f"({type(model).__name__}); {spec.name} supports: {', '.join(spec.families)}")
    values = make_params(spec.name, spec.params, params)
    info = family.describe(model)
    reduction = spec.build(values, info)
    return family.patch(model, reduction, method=spec.name, params=values)
