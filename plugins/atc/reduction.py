"""The ``atc`` plugin's reduction code (its clustering and ``build``), imported when a run asks
for the method; its parameters and registration are :mod:`vitbench_plugins.atc`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.cluster.hierarchy import cut_tree, linkage as hierarchy

from vitbench.kit import ClusterMergeReducer, ModelInfo, Reduction, chosen_layers
from vitbench_plugins.atc import ATCParams


def cosine_distances(metric: torch.Tensor) -> torch.Tensor:
    """``1 - cos(m_i, m_j)`` between the tokens of each image (paper Sec. 3), ``[B, N, N]`` in fp64."""
    m = torch.nn.functional.normalize(metric.double(), dim=-1)
    dist = (1.0 - m @ m.mT).clamp_min(0.0)
    return dist * (1 - torch.eye(dist.shape[-1], dtype=dist.dtype, device=dist.device))


def agglomerative(metric: torch.Tensor, clusters: int, linkage: str = "average") -> torch.Tensor:
    """Agglomerative clustering of ``metric [B, N, C]`` into ``clusters`` by ``linkage``: each
    token's cluster ``[B, N]``, clusters numbered by their first token."""
    dist = cosine_distances(metric).cpu().numpy()
    n = dist.shape[-1]
    upper = np.triu_indices(n, k=1)  # the condensed (pairwise) form scipy takes
    assign = np.empty(dist.shape[:2], dtype=np.int64)
    for b in range(dist.shape[0]):
        labels = cut_tree(hierarchy(dist[b][upper], method=linkage), n_clusters=clusters)[:, 0]
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        assign[b] = np.argsort(np.argsort(first))[inverse]
    return torch.from_numpy(assign).to(metric.device)


def build(params: ATCParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("atc", params.layers, info.depth)

    def cluster(keys: torch.Tensor, clusters: int) -> torch.Tensor:
        return agglomerative(keys, clusters, params.linkage)

    reducers = [ClusterMergeReducer(params.keep, cluster, features="keys") if i in layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
