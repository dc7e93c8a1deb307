"""What every family adapter's ``patch`` uses: the checks before it patches and the forward
pre-hooks on the model's input (docs/architecture.md, "Engine"; docs/guide/families.md)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from vitbench.core.contract import ModelInfo, Reduction
from vitbench.engine.block import ReductionContext, reduction_context
from vitbench.engine.reducer import check_reducers, reduction_needs
from vitbench.errors import UnsupportedError

__all__ = ["RememberInputs", "ResizeInputs", "describe_for_patch"]


def describe_for_patch(model: nn.Module, reduction: Reduction, method: str,
                       describe: Callable[[nn.Module], ModelInfo], provides: frozenset[str],
                       what: str = "blocks") -> ModelInfo:
    """``describe(model)`` after checking that ``model`` is not reduced yet, that every reducer
    is a :class:`~vitbench.engine.reducer.Reducer` (or ``None``), that what ``reduction`` asks
    for (:func:`~vitbench.engine.reducer.reduction_needs`) is among what the family
    ``provides``, and that it has one reducer per attention block (``what`` names them)."""
    check_reducers(reduction.reducers, method)
    missing = reduction_needs(reduction) - provides
    if missing:
        raise UnsupportedError(f"{method or 'this reduction'} needs {', '.join(sorted(missing))}, which this model "
                               f"family does not provide (it provides {', '.join(sorted(provides))})")
    context = reduction_context(model)
    if context is not None:
        raise UnsupportedError(f"this model is already reduced by {context.method!r}; "
                               f"apply a method to a fresh model")
    info = describe(model)
    if len(reduction.reducers) != info.depth:
        raise ValueError(f"{method}: {len(reduction.reducers)} reducers for {info.depth} {what}")
    return info


class ResizeInputs:
    """A forward pre-hook resizing the input images to ``size`` (bilinear, antialiased, as a
    smaller image would be made from the larger one): a smaller input (``Reduction.input_grid``)."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = size

    def __call__(self, module: nn.Module, args: tuple) -> Optional[tuple]:  # type: ignore[type-arg]
        if not args or tuple(args[0].shape[-2:]) == self.size:
            return None
        images = torch.nn.functional.interpolate(args[0], size=self.size, mode="bilinear", antialias=True,
                                                 align_corners=False)
        return (images, *args[1:])


class RememberInputs:
    """A forward pre-hook keeping a reference to the input images in the reduction context
    (LTM's input clusters).

    An object, not a closure, so ``copy.deepcopy(model)`` gives the copy's hook the copy's
    context."""

    def __init__(self, context: ReductionContext) -> None:
        self.context = context

    def __call__(self, module: nn.Module, args: tuple) -> None:  # type: ignore[type-arg]
        self.context.inputs = args[0] if args else None
