"""Soft clustering merges (Sinkhorn token clustering, docs/methods.md, "Sinkhorn"): each patch token
shares itself among the new tokens by weights, and sizes and sources follow the shares."""
from __future__ import annotations

import torch

from vitbench.engine import TokenState

__all__ = ["soft_cluster"]


def soft_cluster(x: torch.Tensor, state: TokenState, weights: torch.Tensor) -> torch.Tensor:
    """Merge the patch tokens of ``x [B, prefix + N_p, C]`` into ``M`` tokens by ``weights
    [B, N_p, M]`` (each patch's shares, rows summing to 1): token ``k`` is the mean of the patches
    weighted by share times size, its size the shared sizes, its sources the shared sources.
    One-hot shares give :meth:`~vitbench.engine.TokenState.cluster`; the prefix stays first."""
    p = state.prefix
    size = state.sizes(x)
    mass = weights * size[:, p:]  # [B, N_p, M]: what each patch sends to each new token
    size_new = mass.sum(dim=1)[..., None]  # [B, M, 1]
    merged = (mass.mT @ x[:, p:]) / size_new.clamp_min(torch.finfo(x.dtype).tiny)
    shares = weights.detach()  # bookkeeping: no gradient through the sizes and sources
    if state.source is not None:
        state.source = torch.cat([state.source[:, :p], shares.mT.to(state.source.dtype) @ state.source[:, p:]], dim=1)
    state.size = torch.cat([size[:, :p], size_new.detach()], dim=1)
    return torch.cat([x[:, :p], merged], dim=1)
