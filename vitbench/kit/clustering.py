"""Clustering merges (DPC-kNN, k-medoids; docs/methods.md): token distances and the reducer
that turns a clustering into size-weighted merged tokens."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from vitbench.engine import AttnInfo, Reducer, TokenState

__all__ = ["ClusterFn", "ClusterMergeReducer", "token_distances"]

#: ``cluster(x [B, N, C], clusters) -> assign [B, N]``: each patch token's cluster
ClusterFn = Callable[[torch.Tensor, int], torch.Tensor]


def token_distances(x: torch.Tensor) -> torch.Tensor:
    """``d_ij = ||x_i - x_j|| / sqrt(C)`` between the tokens of each image (TCFormer Sec. 3.2), in fp32."""
    return torch.cdist(x.float(), x.float()) / math.sqrt(x.shape[-1])


class ClusterMergeReducer(Reducer):
    """One listed block's clustering merge: the patch tokens become ``ceil(keep * N_p)`` tokens,
    each the size-weighted mean of one cluster (:meth:`~vitbench.engine.TokenState.cluster`);
    the prefix tokens stay first. ``keep`` leaving every token changes nothing. ``features``:
    what is clustered, the tokens or the attention's head-averaged keys (ATC, ToMe's metric)."""

    needs: frozenset[str] = frozenset()

    def __init__(self, keep: float, cluster: ClusterFn, features: str = "tokens") -> None:
        self.keep_ratio = keep
        self.cluster = cluster
        self.features = features
        if features == "keys":
            self.needs = frozenset({"keys"})

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        patches = x.shape[1] - prefix
        clusters = max(1, math.ceil(self.keep_ratio * patches))
        if clusters >= patches:
            return x
        with torch.no_grad():  # the clustering is a choice; gradients flow through the merge
            metric = info.keys if self.features == "keys" else x
            assign = self.cluster(metric[:, prefix:].detach(), clusters)
        return state.cluster(x, assign, clusters)
