"""The ``ppt`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.ppt`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import torch

from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, bipartite_soft_matching, chosen_layers, get_host,
    host_reads_allowed, max_merge, top_tokens,
)
from vitbench_plugins.ppt import PPTParams


class PPTReducer(Reducer):
    """Pool or prune ``r`` tokens per image, by the variance of the significance scores."""

    def __init__(self, r: int, threshold: float, scorer,  # type: ignore[no-untyped-def]
                 order: str = "score") -> None:
        self.r = r
        self.threshold = threshold
        self.scorer = scorer
        self.order = order
        self.needs = frozenset({"keys"}) | scorer.needs

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        r = min(self.r, max_merge(x.shape[1], prefix))
        if r <= 0:
            return x
        scores = self.scorer.score(info, prefix)
        pool = scores.var(dim=-1, unbiased=True) < self.threshold  # [B]
        branch_on_host = host_reads_allowed()  # else (CUDA graphs): both branches, selected per image
        if branch_on_host and bool(pool.all()):
            return state.merge(x, bipartite_soft_matching(info.keys, r, prefix))
        prune_index = top_tokens(scores, x.shape[1] - prefix - r, prefix, order=self.order)
        if branch_on_host and not bool(pool.any()):
            return state.keep(x, prune_index)
        return state.merge_or_keep(x, bipartite_soft_matching(info.keys, r, prefix), prune_index, pool)


def build(params: PPTParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("ppt", params.layers, info.depth)
    scorer = get_host().scorer(params.score)
    reducers = [PPTReducer(params.r, params.threshold, scorer, params.order) if i in layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
