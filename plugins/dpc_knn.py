"""DPC-KNN token clustering merge, training-free (TCFormer, Zeng et al., CVPR 2022, §3.2
"Clustering-based Token Merge"; density peaks clustering of Rodriguez & Laio, Science 2014,
with a k-nearest-neighbour density; docs/methods.md §8).

At each listed block (after the attention residual, docs/methods.md §0) the ``N_p`` patch tokens
are clustered into ``M = ceil(keep * N_p)`` clusters: the ``M`` tokens with the largest
``rho * delta`` (kNN density times the distance to the nearest denser token) are the centres,
every token joins its nearest centre, and each cluster becomes the size-weighted mean of its
members (sizes stand in for TCFormer's learned importance). Density ties break by position, so
the method is deterministic. ``keep = 1`` changes nothing.

Parameters: ``keep``, ``layers``, ``k`` (neighbours of the density)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.kit import ClusterMergeReducer, check_layers, token_distances


@dataclass(frozen=True)
class DPCKNNParams:
    """``keep``: clusters per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster; ``k``: neighbours of the density estimate (TCFormer: 5)."""

    keep: float = 0.5
    layers: tuple[int, ...] = (3, 6, 9)
    k: int = 5

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"dpc-knn.keep={self.keep} is out of range; it must be in (0, 1]")
        if self.k < 1:
            raise ParamError(f"dpc-knn.k={self.k} is out of range; it must be an integer >= 1")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"dpc-knn.layers={list(self.layers)}: block indices are >= 0")


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
    check_layers("dpc-knn", params.layers, info.depth)
    def cluster(x: torch.Tensor, clusters: int) -> torch.Tensor:
        return dpc_knn(x, clusters, params.k)[0]

    reducers = [ClusterMergeReducer(params.keep, cluster) if i in params.layers else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dpc-knn",
        kind="merging",
        params=DPCKNNParams,
        build=build,
        families=("vit",),
        # the fraction of patch tokens kept (as clusters) at each listed block
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="DPC-KNN: density-peaks clustering merge of the patch tokens at listed blocks (TCFormer's CTM, "
                    "training-free)",
    ))
