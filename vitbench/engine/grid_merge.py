"""Grid merges: how a token method tells a conv-hybrid adapter that it merged to a grid.

Conv hybrids keep a grid (docs/methods.md, "LTM / IBTM", "Conv hybrids"): a method that merges a token sequence
of ``H x W`` patches into ``P = H' x W'`` tokens declares the ``(H', W')`` grid and hands over
the merge matrices it used, so that the family adapter can fold the tokens to the reduced map
and merge whatever else must stay aligned with them (MobileViT's fusion shortcut) "with the same
G". Plain ViTs ignore it. The record lives in the sequence's :class:`TokenState` (``private``
under :data:`GRID_MERGE`), so it restarts with every sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from vitbench.core.contract import ModelInfo
from vitbench.engine.token_state import TokenState

#: the key of the record in ``TokenState.private``
GRID_MERGE = "grid_merge"


@dataclass
class GridMerge:
    """``grid``: the ``(H', W')`` the patch tokens now lie on (raster order);
    ``matrices``: the merges so far, in order, each ``G [B or 1, N_in, N_out]`` with columns
    summing to 1 (merged token ``q`` is ``sum_i G_iq x_i``), acting on the non-prefix tokens."""

    grid: tuple[int, int]
    matrices: list[torch.Tensor] = field(default_factory=list)

    def apply(self, tokens: torch.Tensor) -> torch.Tensor:
        """Merge other tokens ``[B, N, C]`` (no prefix) exactly as the patch tokens were."""
        for g in self.matrices:
            tokens = g.mT @ tokens
        return tokens


def record_grid_merge(state: TokenState, g: torch.Tensor, grid: Optional[tuple[int, int]] = None) -> None:
    """Record merge ``g`` ``[B or 1, N_in, N_out]``; ``grid`` starts a record (the first merge of
    a sequence), without it ``g`` is appended to the sequence's record (``N_out`` must stay)."""
    record = grid_merge(state)
    if grid is not None:
        state.private[GRID_MERGE] = GridMerge(tuple(grid), [g])  # type: ignore[arg-type]
    elif record is not None:
        record.matrices.append(g)


def grid_merge(state: Optional[TokenState]) -> Optional[GridMerge]:
    """The sequence's grid-merge record, ``None`` when the method declared none."""
    if state is None:
        return None
    return state.private.get(GRID_MERGE)


def square_merge_grid(info: ModelInfo, ratio: float) -> tuple[int, tuple[int, int]]:
    """A merge to ``ratio`` of a token sequence: ``P = ceil(ratio * N_p)`` tokens on a
    ``ceil(sqrt(P))`` square grid (ViT; a Swin tile merges as a short ViT sequence)."""
    p = max(1, math.ceil(ratio * info.num_patches - 1e-9))  # 1e-9: 0.7 * 10 is 7.000000000000001
    side = math.isqrt(p - 1) + 1  # ceil(sqrt(p)), exact
    return p, (side, side)


def scaled_merge_grid(info: ModelInfo, ratio: float) -> tuple[int, tuple[int, int]]:
    """A merge to ``ratio`` of a map that keeps a grid (docs/methods.md, "LTM / IBTM", "Conv
    hybrids"): ``H' = ceil(H sqrt(ratio))``, ``W'`` likewise, ``P = H'W'``; ``info`` describes one
    token sequence (MobileViT, EfficientViT)."""
    root = math.sqrt(ratio)
    h, w = (max(1, math.ceil(n * root - 1e-9)) for n in info.grid)  # 1e-9: float noise at ratio 1
    return h * w, (h, w)
