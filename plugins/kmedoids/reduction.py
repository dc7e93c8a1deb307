"""The ``kmedoids`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.kmedoids`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import torch

from vitbench.kit import ClusterMergeReducer, ModelInfo, Reduction, chosen_layers, token_distances
from vitbench_plugins.kmedoids import KMedoidsParams


def _nearest(dist: torch.Tensor, medoids: torch.Tensor) -> torch.Tensor:
    """Each token's nearest medoid (``[B, N]``, cluster indices), each medoid in its own cluster."""
    b, n, _ = dist.shape
    assign = dist.gather(2, medoids[:, None, :].expand(-1, n, -1)).argmin(dim=-1)
    return assign.scatter(1, medoids, torch.arange(medoids.shape[1], device=dist.device).expand(b, -1))


def kmedoids(x: torch.Tensor, clusters: int, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K-Medoids of ``x [B, N, C]`` into ``clusters``: ``(assign [B, N], medoids [B, clusters])``."""
    b, n, _ = x.shape
    dist = token_distances(x)
    start = torch.floor(torch.linspace(0, n - 1, clusters, device=x.device, dtype=torch.float64) + 0.5).long()
    medoids = start.expand(b, -1).clone()
    for _ in range(iters):
        assign = _nearest(dist, medoids)
        member = torch.nn.functional.one_hot(assign, clusters).bool()  # [B, N, M]
        same = assign[:, :, None] == assign[:, None, :]  # [B, N, N]
        cost = (dist * same).sum(-1)  # each token's summed distance to its cluster's members
        cost = torch.where(member, cost[..., None], torch.full_like(cost[..., None], float("inf")))
        medoids = cost.argmin(dim=1)  # [B, M]: the member of least cost (clusters are never empty)
    return _nearest(dist, medoids), medoids


def build(params: KMedoidsParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("kmedoids", params.layers, info.depth)
    def cluster(x: torch.Tensor, clusters: int) -> torch.Tensor:
        return kmedoids(x, clusters, params.iters)[0]

    reducers = [ClusterMergeReducer(params.keep, cluster) if i in layers else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
