"""The ``sinkhorn`` plugin's reduction code (its reducers and ``build``), imported when a run asks
for the method; its parameters and registration are :mod:`vitbench_plugins.sinkhorn`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, adamw_cosine, chosen_layers, soft_cluster
from vitbench_plugins.sinkhorn import SinkhornParams


def sinkhorn(log_kernel: torch.Tensor, iters: int) -> torch.Tensor:
    """Entropic transport plan ``[B, N, M]`` of ``log_kernel [B, N, M]`` between uniform marginals
    (rows ``1/N``, columns ``1/M``): ``iters`` log-domain Sinkhorn-Knopp steps, each scaling the
    columns then the rows, so the rows are exact and the columns converge (Cuturi 2013)."""
    _, n, m = log_kernel.shape
    log_a, log_b = -math.log(n), -math.log(m)
    f = log_kernel.new_zeros(log_kernel.shape[:2])
    g = log_kernel.new_zeros(log_kernel.shape[0], m)
    for _ in range(iters):
        g = log_b - torch.logsumexp(log_kernel + f[:, :, None], dim=1)
        f = log_a - torch.logsumexp(log_kernel + g[:, None, :], dim=2)
    return torch.exp(log_kernel + f[:, :, None] + g[:, None, :])


def site_counts(keep: float, sites: int, patches: int) -> list[int]:
    """Tokens after each of ``sites`` listed blocks: ``ceil(keep * previous)`` from ``patches``."""
    counts, n = [], patches
    for _ in range(sites):
        n = max(1, math.ceil(keep * n))
        counts.append(n)
    return counts


class SinkhornReducer(nn.Module, Reducer):
    """One listed block: the patch tokens become one token per learned centre."""

    needs: frozenset[str] = frozenset()  # reads only the tokens: the fused kernel stays

    def __init__(self, clusters: int, dim: int, eps: float, iters: int, seed: int) -> None:
        super().__init__()
        self.eps = eps
        self.iters = iters
        # unit vectors drawn from a zero-mean unit-variance Gaussian (as the official code), seeded
        init = torch.randn(clusters, dim, generator=torch.Generator().manual_seed(seed))
        self.centres = nn.Parameter(nn.functional.normalize(init, dim=-1))

    def extra_repr(self) -> str:
        return f"clusters={self.centres.shape[0]}, eps={self.eps}, iters={self.iters}"

    def shares(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each token's shares of the centres ``[B, N, M]`` (the plan times ``N``: rows sum to 1)."""
        t = nn.functional.normalize(tokens, dim=-1)
        c = nn.functional.normalize(self.centres, dim=-1).to(t.dtype)
        return sinkhorn((t @ c.mT) / self.eps, self.iters) * tokens.shape[1]

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if self.centres.shape[0] >= x.shape[1] - state.prefix:  # no fewer centres than patches
            return x
        return soft_cluster(x, state, self.shares(x[:, state.prefix:]))


def build(params: SinkhornParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("sinkhorn", params.layers, info.depth)
    layers = sorted(layers)
    counts = dict(zip(layers, site_counts(params.keep, len(layers), info.num_patches)))
    reducers = [SinkhornReducer(counts[i], info.embed_dim, params.eps, params.iters, seed=i)
                if i in counts and params.keep < 1.0 else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True, train=(adamw_cosine("centres", params, trainable=("centres",)),))
