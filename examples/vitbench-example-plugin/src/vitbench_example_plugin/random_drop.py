"""random-drop's reducer and ``build`` (:mod:`vitbench_example_plugin` registers the method by
reference, so this module and torch are imported only when a run asks for it)."""
from __future__ import annotations

import math

import torch

from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, chosen_layers
from vitbench_example_plugin import RandomDropParams


class RandomDropReducer(Reducer):
    """Keep a random ``keep`` fraction of the patch tokens of each image (a token step only: the
    other hooks of :class:`vitbench.engine.Reducer` keep their defaults)."""

    needs: frozenset[str] = frozenset()  # nothing from the attention: the fused kernel stays

    def __init__(self, keep: float, seed: int) -> None:
        self.keep_ratio = keep
        self.seed = seed

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        batch, patches = x.shape[0], x.shape[1] - prefix
        k = math.ceil(self.keep_ratio * patches)
        if k >= patches:
            return x
        generator = torch.Generator().manual_seed(self.seed)  # CPU draw: same on every device
        order = torch.rand(batch, patches, generator=generator).argsort(dim=-1)
        kept = order[:, :k].sort(dim=-1).values.to(x.device) + prefix
        head = torch.arange(prefix, device=x.device).expand(batch, prefix)
        return state.keep(x, torch.cat([head, kept], dim=1))


def build(params: RandomDropParams, info: ModelInfo) -> Reduction:
    """One reducer per listed block; the others only apply proportional attention."""
    layers = chosen_layers("random-drop", params.layers, info.depth)  # None: (3, 6, 9) of 12, scaled
    reducers = [RandomDropReducer(params.keep, params.seed + i) if i in layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
