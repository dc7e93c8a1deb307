"""The ``dpc_knn`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.dpc_knn`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import torch

from vitbench.kit import ClusterMergeReducer, ModelInfo, Reduction, chosen_layers, token_distances
from vitbench_plugins.dpc_knn import DPCKNNParams


def dpc_knn(x: torch.Tensor, clusters: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Density-peaks clustering of ``x [B, N, C]`` into ``clusters``: ``(assign [B, N], centres
    [B, clusters])`` -- each token's cluster and each cluster's centre token, by score."""
    b, n, _ = x.shape
    dist = token_distances(x)  # [B, N, N]
    kk = min(k, n - 1)
    if kk > 0:  # the k nearest *other* tokens: the smallest k+1 distances include the token itself
        near = dist.topk(kk + 1, dim=-1, largest=False).values[..., 1:]
        density = torch.exp(-(near ** 2).mean(-1))
    else:
        density = torch.ones(b, n, device=x.device)
    # ties broken by position (earlier = denser), deterministic instead of TCFormer's noise
    order = torch.arange(n, device=x.device, dtype=density.dtype)
    density = density - order * torch.finfo(density.dtype).eps * density.abs().clamp_min(1e-30)
    denser = density[:, None, :] > density[:, :, None]  # [B, i, j]: j denser than i
    far = dist.amax(dim=-1)
    delta = torch.where(denser, dist, torch.full_like(dist, float("inf"))).amin(dim=-1)
    delta = torch.where(torch.isinf(delta), far, delta)  # the densest token: its largest distance
    centres = (density * delta).topk(clusters, dim=-1).indices  # [B, M]
    to_centre = dist.gather(2, centres[:, None, :].expand(-1, n, -1))  # [B, N, M]
    assign = to_centre.argmin(dim=-1)
    # each centre is its own cluster (a duplicate token could otherwise pull it elsewhere)
    assign.scatter_(1, centres, torch.arange(clusters, device=x.device).expand(b, -1))
    return assign, centres


def build(params: DPCKNNParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("dpc-knn", params.layers, info.depth)
    def cluster(x: torch.Tensor, clusters: int) -> torch.Tensor:
        return dpc_knn(x, clusters, params.k)[0]

    reducers = [ClusterMergeReducer(params.keep, cluster) if i in layers else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
