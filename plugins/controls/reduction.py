"""The controls' reduction code (:mod:`vitbench_plugins.controls` registers them)."""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from vitbench.errors import UnsupportedError
from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, chosen_layers, top_tokens
from vitbench.kit.ib import run_seed
from vitbench_plugins.controls import DownsampleParams, RandomParams

#: the smaller grid keeps the model's shape: its sides' scales differ by at most this factor
ASPECT_SLACK = Fraction(5, 4)


class RandomReducer(Reducer):
    """Keep ``ceil(keep * patches)`` patch tokens drawn at random, the same positions in every
    image (one draw per block and token count, from ``seed``), in their original order."""

    def __init__(self, keep: float, seed: int) -> None:
        self.keep_ratio = keep
        self.seed = seed
        self._scores: dict[int, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        patches = x.shape[1] - prefix
        k = math.ceil(self.keep_ratio * patches)
        if k >= patches:
            return x
        scores = self._scores.get(patches)
        if scores is None:
            scores = torch.rand(patches, generator=torch.Generator().manual_seed(self.seed))
            self._scores[patches] = scores
        return state.keep(x, top_tokens(scores.to(x.device).expand(x.shape[0], patches), k, prefix))


def build_random(params: RandomParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("random", params.layers, info.depth)
    seed = run_seed()
    reducers = [RandomReducer(params.keep, seed * 1009 + i) if i in layers else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=False)  # every token stays of size 1


def smaller_grid(grid: tuple[int, int], keep: float, step: int = 1) -> tuple[int, int]:
    """The grid ``(rows, cols)`` with the most patches, at most ``ceil(keep * rows * cols)`` of
    ``grid``, sides multiples of ``step``, whose sides shrink by scales within
    :data:`ASPECT_SLACK` of each other (the squarest, then the taller, on a tie)."""
    rows, cols = grid
    most = math.ceil(keep * rows * cols - 1e-9)  # 1e-9: 0.7 * 10 is 7.000000000000001

    def uneven(r: int, c: int) -> Fraction:  # how much more one side shrinks than the other, >= 1
        a, b = Fraction(r, rows), Fraction(c, cols)
        return max(a, b) / min(a, b)

    fits = [(r, c) for r in range(step, rows + 1, step) for c in range(step, cols + 1, step)
            if r * c <= most and uneven(r, c) <= ASPECT_SLACK]
    return max(fits, key=lambda rc: (rc[0] * rc[1], -uneven(*rc), rc[0]), default=(step, step))


def build_downsample(params: DownsampleParams, info: ModelInfo) -> Reduction:
    grid, step = info.image_grid, info.patch_grid_step
    if min(grid) < 1:
        raise UnsupportedError("downsample needs a model with a fixed patch grid (timm's patch_embed.grid_size)")
    return Reduction([None] * info.depth, prop_attn=False, input_grid=smaller_grid(grid, params.keep, step))
