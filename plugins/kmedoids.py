"""K-Medoids token clustering merge, training-free (the clustering reduction evaluated beside
DPC-KNN by Haurum et al., "Which Tokens to Use? Investigating Token Reduction in Vision
Transformers", ICCV Workshops 2023; the algorithm: Voronoi iteration, Park & Jun 2009;
docs/methods.md §9).

At each listed block (after the attention residual, docs/methods.md §0) the ``N_p`` patch tokens
become ``M = ceil(keep * N_p)`` tokens: ``M`` medoids start evenly spread over the tokens in their
current order (deterministic), ``iters`` Voronoi steps move each medoid to its cluster's member
of least summed distance, and each final cluster becomes the size-weighted mean of its members.
``keep = 1`` changes nothing.

Parameters: ``keep``, ``layers``, ``iters``."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.kit import ClusterMergeReducer, check_layers, token_distances


@dataclass(frozen=True)
class KMedoidsParams:
    """``keep``: clusters per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster; ``iters``: Voronoi iterations."""

    keep: float = 0.5
    layers: tuple[int, ...] = (3, 6, 9)
    iters: int = 3

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"kmedoids.keep={self.keep} is out of range; it must be in (0, 1]")
        if self.iters < 0:
            raise ParamError(f"kmedoids.iters={self.iters} is out of range; it must be an integer >= 0")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"kmedoids.layers={list(self.layers)}: block indices are >= 0")


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
    check_layers("kmedoids", params.layers, info.depth)
    def cluster(x: torch.Tensor, clusters: int) -> torch.Tensor:
        return kmedoids(x, clusters, params.iters)[0]

    reducers = [ClusterMergeReducer(params.keep, cluster) if i in params.layers else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="kmedoids",
        kind="merging",
        params=KMedoidsParams,
        build=build,
        families=("vit",),
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="K-Medoids: clustering merge of the patch tokens at listed blocks (Voronoi iteration, "
                    "size-weighted cluster means; training-free)",
    ))
