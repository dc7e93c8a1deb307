"""Which tokens a pruning step keeps: the best-scoring patches behind the prefix (docs/methods.md, "PPT")."""
from __future__ import annotations

import torch

from vitbench.engine.ordering import descending_order

__all__ = ["TOKEN_ORDERS", "top_tokens"]

#: layouts of the kept patches: ``"score"`` highest first, ``"original"`` in their current order
TOKEN_ORDERS = ("score", "original")


def top_tokens(scores: torch.Tensor, k: int, prefix: int, *, order: str = "original") -> torch.Tensor:
    """Indices ``[B, prefix + k]``: the prefix tokens in place, then the ``k`` best of the patch
    ``scores [B, N - prefix]``, highest first (``order="score"``) or in original order.

    Equal scores keep the lower position first (stable sort), in both layouts.
    """
    if order not in TOKEN_ORDERS:
        raise ValueError(f"order={order!r}; valid orders: {', '.join(TOKEN_ORDERS)}")
    best = descending_order(scores)[:, :k]
    if order == "original":
        best = best.sort(dim=-1).values
    head = torch.arange(prefix, device=scores.device).expand(scores.shape[0], prefix)
    return torch.cat([head, best + prefix], dim=1)
