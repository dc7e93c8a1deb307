"""Tokens removed per block: ToMe's ``r`` as an int, a per-block list, or ``(r, inflect)`` (docs/methods.md, "ToMe")."""
from __future__ import annotations

from typing import Union

from vitbench.errors import ParamError

__all__ = ["schedule"]


def schedule(r: Union[int, list[int], tuple[int, float]], depth: int, method: str = "tome") -> list[int]:
    """Tokens to remove in each of ``depth`` blocks; ``(r, inflect)`` runs linearly from
    ``r*(1-inflect)`` to ``2r - r*(1-inflect)``; ``method`` names the parameter in errors."""
    if isinstance(r, int):
        return [r] * depth
    if isinstance(r, tuple):
        base, inflect = r
        low = base * (1.0 - inflect)
        high = 2 * base - low
        step = (high - low) / max(depth - 1, 1)
        return [max(int(low + step * i), 0) for i in range(depth)]
    if len(r) != depth:
        raise ParamError(f"{method}.r has {len(r)} entries; the model has {depth} blocks")
    return list(r)
