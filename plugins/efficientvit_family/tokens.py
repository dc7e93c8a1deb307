"""Token methods on EfficientViT's maps (docs/methods.md, "EfficientViT"): grid merges only.

An ``EfficientVitBlock`` is attention then a feed-forward, as a ViT block: ``x = x +
LiteMLA(x)`` (the context module), then ``x = x + MBConv(x)`` (the local module). The token step
sits between them, on the map flattened to ``[B, H*W, C]`` (raster order, no prefix), and the
tokens are folded to the grid their merge declares (:mod:`vitbench.engine.grid_merge`), so the
MBConv and everything after it run on the smaller map, as on MobileViT. The blocks of one stage
share a token state; each stage starts a new one."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from vitbench.kit.family import (
    AttnInfo, ModelInfo, Reducer, ReductionContext, TokenState, grid_merge, keep_wrapped_keys
)
from vitbench.errors import UnsupportedError

Grid = tuple[int, int]


def half_map(grid: Grid) -> Grid:
    """The map after a stride-2 layer (kernel 3, padding 1: ``ceil(n / 2)``)."""
    return -(-grid[0] // 2), -(-grid[1] // 2)


def sequence_grids(info: ModelInfo, shrink: Callable[[int, Grid], Grid]) -> list[tuple[Grid, Grid]]:
    """``(grid seen, grid folded to)`` per stage when stage ``s`` seeing grid ``g`` folds its
    tokens to ``shrink(s, g)``: one stride-2 MBConv leads into each later stage, so it sees
    ``ceil(H'/2) x ceil(W'/2)`` of the previous stage's ``H' x W'``."""
    firsts = [b for b in info.blocks if b.first]
    plan: list[tuple[Grid, Grid]] = []
    for before, blk in zip([None, *firsts], firsts):
        seen = blk.grid
        if before is not None:
            if blk.grid != half_map(before.grid):
                raise UnsupportedError(f"the maps of EfficientViT's LiteMLA stages {before.sequence} and "
                                       f"{blk.sequence} are not one stride-2 layer apart ({before.grid} -> "
                                       f"{blk.grid}); a grid merge needs each stage to halve the map")
            seen = half_map(plan[-1][1])
        plan.append((seen, tuple(shrink(blk.sequence, seen))))  # type: ignore[arg-type]
    return plan


def check_token_reducers(reducers: list[Reducer | None], method: str) -> None:
    """A method on EfficientViT either merges tokens to grids or selects channels, not both
    (what a token reducer may ask for is the family's ``PROVIDES``, checked before)."""
    for i, reducer in enumerate(reducers):
        if reducer is not None and reducer.selects_channels:
            raise UnsupportedError(f"{method}: block {i}'s reducer selects channels and others reduce tokens; "
                                   f"on EfficientViT a method is one or the other")


class ReducingEfficientVitBlock(nn.Module):
    """A timm ``EfficientVitBlock`` with a token step between its context and local modules
    (module docstring). ``starts_sequence`` marks a stage's first block (a fresh
    :class:`TokenState`); the block with ``index == 0`` also starts the forward's token counts
    and extras. The state dict has timm's keys."""

    def __init__(self, block: nn.Module, index: int, reducer: Reducer | None, context: ReductionContext,
                 starts_sequence: bool) -> None:
        super().__init__()
        self.block = block
        self.index = index
        self.starts_forward = index == 0
        self.starts_sequence = starts_sequence
        self.reducer = reducer  # an nn.Module reducer becomes a submodule (``...blocks.1.reducer.*``)
        self._context = context
        keep_wrapped_keys(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self._context
        new_forward = self.starts_forward or ctx.state is None
        if new_forward:
            ctx.token_counts = []
            ctx.extras = {}
        x = self.block.context_module(x)
        batch, channels, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        if new_forward or self.starts_sequence:
            ctx.state = TokenState.start(tokens, 0, ctx.trace_source)
        if self.reducer is not None:
            tokens = self.reducer(tokens, ctx.state, AttnInfo())
            record = grid_merge(ctx.state)
            grid = record.grid if record is not None else (h, w)
            if tokens.shape[1] != grid[0] * grid[1]:
                raise ValueError(f"{ctx.method}: {tokens.shape[1]} tokens do not fill the "
                                 f"{grid[0]}x{grid[1]} grid of block {self.index}'s merge")
            x = tokens.transpose(1, 2).reshape(batch, channels, *grid)
        ctx.token_counts.append(x.shape[-2] * x.shape[-1])
        return self.block.local_module(x)
