"""What every family adapter's ``patch`` checks first (docs/architecture.md, "Engine")."""
from __future__ import annotations

from typing import Callable

from torch import nn

from vitbench.core.contract import ModelInfo, Reduction
from vitbench.engine.block import reduction_context
from vitbench.engine.reducer import check_reducers
from vitbench.errors import UnsupportedError


def describe_for_patch(model: nn.Module, reduction: Reduction, method: str,
                       describe: Callable[[nn.Module], ModelInfo], what: str = "blocks",
                       resizes: bool = False, before_attention: bool = False, restores: bool = False) -> ModelInfo:
    """``describe(model)`` after checking that ``model`` is not reduced yet, that every reducer
    is a :class:`~vitbench.engine.reducer.Reducer` (or ``None``), that ``reduction`` has one
    per attention block (``what`` names them in the error), that it asks for a smaller input
    only of an adapter that ``resizes``, reduces before a block's attention only on an adapter
    whose blocks run such a step (``before_attention``) and brings pruned tokens back (last-layer
    fusion) only on one whose sequence may grow back (``restores``)."""
    check_reducers(reduction.reducers, method)
    if not before_attention and any(getattr(r, "before_attention", False) for r in reduction.reducers):
        raise UnsupportedError(f"{method}: this model family's blocks reduce after the attention only; a reducer "
                               f"that runs before it (Reducer.before_attention) is supported on the vit and "
                               f"mobilevit families")
    if not restores and any(getattr(r, "restores", False) for r in reduction.reducers):
        raise UnsupportedError(f"{method}: this model family's blocks cannot take back tokens pruned earlier; a "
                               f"reducer that restores them (Reducer.restores, last-layer fusion) is supported on "
                               f"the vit family only")
    if reduction.input_grid is not None and not resizes:
        raise UnsupportedError(f"{method}: this model family's adapter feeds the model its own image size; "
                               f"a smaller input (Reduction.input_grid) is supported on the vit and swin families only")
    context = reduction_context(model)
    if context is not None:
        raise UnsupportedError(f"this model is already reduced by {context.method!r}; "
                               f"apply a method to a fresh model")
    info = describe(model)
    if len(reduction.reducers) != info.depth:
        raise ValueError(f"{method}: {len(reduction.reducers)} reducers for {info.depth} {what}")
    return info
