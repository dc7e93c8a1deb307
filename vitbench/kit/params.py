"""Checks of the parameters many methods share: block indices (and their defaults, scaled to the
model's depth) and scorer names."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

from vitbench.errors import ParamError, UnknownNameError
from vitbench.host import get_host

__all__ = ["blocks_from_quarter", "check_layers", "check_scorer", "chosen_layers", "quarter_blocks"]


def check_scorer(method: str, score: str) -> None:
    """Raise a ParamError naming ``METHOD.score`` and the registered scorers."""
    try:
        get_host().scorer(score)
    except UnknownNameError as exc:
        raise ParamError(f"{method}.score={score!r}: {exc}") from None


def check_layers(method: str, layers: tuple[int, ...], depth: int) -> None:
    """Raise a ParamError naming a block index the model does not have."""
    for layer in layers:
        if not 0 <= layer < depth:
            raise ParamError(f"{method}.layers contains {layer}; valid block indices for this model: "
                             f"0..{depth - 1}")


def quarter_blocks(depth: int) -> tuple[int, ...]:
    """The blocks at a quarter, half and three quarters of ``depth``: (3, 6, 9) of 12, the schedule
    of top-k (EViT), DynamicViT and the clustering methods, (1, 3, 4) of 6."""
    return tuple(sorted({depth // 4, depth // 2, 3 * depth // 4}))


def blocks_from_quarter(depth: int) -> tuple[int, ...]:
    """Every block from a quarter of ``depth`` on: (3, ..., 11) of 12 (ATS's DeiT-S setting)."""
    return tuple(range(depth // 4, depth))


def chosen_layers(method: str, layers: Optional[Sequence[int]], depth: int,
                  default: Callable[[int], tuple[int, ...]] = quarter_blocks) -> tuple[int, ...]:
    """``layers`` as given, or ``default(depth)`` when None (so a default fits any depth), checked
    against the model's blocks."""
    chosen = default(depth) if layers is None else tuple(layers)
    check_layers(method, chosen, depth)
    return chosen
