"""The ``tome`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.tome`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import torch

from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, bipartite_soft_matching, max_merge, schedule,
)
from vitbench_plugins.tome import ToMeParams


class ToMeReducer(Reducer):
    """Merge ``r`` tokens after a block's attention."""

    needs = frozenset({"keys"})

    def __init__(self, r: int) -> None:
        self.r = r

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if min(self.r, max_merge(x.shape[1], state.prefix)) <= 0:  # nothing left to merge
            return x
        return state.merge(x, bipartite_soft_matching(info.keys, self.r, state.prefix))


def build(params: ToMeParams, info: ModelInfo) -> Reduction:
    reducers = [ToMeReducer(r) if r > 0 else None for r in schedule(params.r, info.depth)]
    return Reduction(reducers, prop_attn=params.prop_attn, trace_source=params.trace_source)
