"""The ``topk`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.topk`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math

import torch

from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, chosen_layers, get_host, top_tokens
from vitbench_plugins.topk import TopKParams


class TopKReducer(Reducer):
    def __init__(self, keep: float, fuse: bool, scorer) -> None:  # type: ignore[no-untyped-def]
        self.keep_ratio = keep
        self.fuse = fuse
        self.scorer = scorer
        self.needs = frozenset(scorer.needs)

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        patches = x.shape[1] - prefix
        k = math.ceil(self.keep_ratio * patches)
        if k >= patches:
            return x
        scores = self.scorer.score(info, prefix)
        index = top_tokens(scores, k, prefix)
        if not self.fuse:
            return state.keep(x, index)
        dropped = torch.ones_like(scores, dtype=torch.bool).scatter_(1, index[:, prefix:] - prefix, False)
        weights = (scores * dropped)[..., None]  # [B, Np, 1]
        token = (x[:, prefix:] * weights).sum(dim=1, keepdim=True)
        size = (state.sizes(x)[:, prefix:] * dropped[..., None]).sum(dim=1, keepdim=True)
        source = None
        if state.source is not None:
            source = (state.source[:, prefix:] * dropped[..., None]).sum(dim=1, keepdim=True)
        x = state.keep(x, index)
        return state.append(x, token, size, source)


def build(params: TopKParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("topk", params.layers, info.depth)
    scorer = get_host().scorer(params.score)
    reducers = [TopKReducer(params.keep, params.fuse, scorer) if i in layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
