"""Where a windowed family reduces tokens: the tiles of a map (Swin's MLP, docs/methods.md, "Swin")."""
from __future__ import annotations

__all__ = ["tile_of"]

Grid = tuple[int, int]


def _nearest_divisor(side: int, window: int) -> int:
    divisors = [d for d in range(1, side + 1) if side % d == 0]
    return min(divisors, key=lambda d: (abs(d - window), -d))


def tile_of(size: Grid, window: Grid) -> Grid:
    """The tiles a block's MLP tokens are reduced in: the window itself when it divides the map
    (every stage of a 224-px Swin), else per side the divisor of the map nearest the window
    (ties: the larger), so that the tiles cover the map exactly, with no padding."""
    return _nearest_divisor(size[0], window[0]), _nearest_divisor(size[1], window[1])
