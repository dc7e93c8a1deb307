"""The straight-through (Gumbel-)sigmoid binary mask shared by LTMP's thresholds, LTM's merge
masks and DCS's channel masks (docs/methods.md, "LTMP", "LTM / IBTM", "DCS"): a hard 0/1 forward, the gradient of
``sigmoid(logits / tau)`` backward.
"""
from __future__ import annotations

import torch

__all__ = ["gumbel_difference", "straight_through_mask"]


def gumbel_difference(like: torch.Tensor) -> torch.Tensor:
    """``g1 - g2`` for two independent standard Gumbel samples of ``like``'s shape.

    A Gumbel sample is ``-log(E)`` with ``E ~ Exp(1)`` (never 0, so no clamping is needed)."""
    g1 = -torch.empty_like(like).exponential_().log()
    g2 = -torch.empty_like(like).exponential_().log()
    return g1 - g2


def straight_through_mask(logits: torch.Tensor, tau: torch.Tensor | float, noisy: bool) -> torch.Tensor:
    """Hard 0/1 mask with the gradient of ``sigmoid((logits + g1 - g2) / tau)``.

    ``noisy`` adds the Gumbel noise (training); without it the mask is deterministic. The hard
    value is taken as ``logits (+ noise) > 0``, which is ``M > 0.5`` in exact arithmetic and,
    unlike thresholding the rounded sigmoid, agrees exactly with the shrink rule ``alpha > 0``.
    The forward value is exactly 0 or 1 (``soft - soft.detach()`` is exactly zero).
    """
    if noisy:
        logits = logits + gumbel_difference(logits)
    soft = torch.sigmoid(logits / tau)
    hard = (logits > 0).to(soft.dtype)
    return hard + (soft - soft.detach())
