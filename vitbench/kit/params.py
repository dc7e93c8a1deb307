"""Checks of the parameters many methods share: block indices and scorer names."""
from __future__ import annotations

from vitbench.errors import ParamError, UnknownNameError
from vitbench.host import get_host

__all__ = ["check_layers", "check_scorer"]


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
