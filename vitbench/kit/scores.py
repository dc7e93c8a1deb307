"""Token significance scores from one block's attention: the PPT thesis' score functions
(docs/methods.md, "Token scorers").

Each maps the block's attention to a significance per patch token ``[B, N - prefix]``,
normalised to sum 1 per image; the attention includes proportional attention.
"""
from __future__ import annotations

import torch

from vitbench.engine import AttnInfo

__all__ = ["average_score", "cls_attn_score", "entropy_score"]

EPS = 1e-6


def _normalise(s: torch.Tensor) -> torch.Tensor:
    return s / s.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)


def _value_norm(info: AttnInfo, prefix: int) -> torch.Tensor:
    v = info.values[:, :, prefix:]  # [B, h, Np, d]
    return v.pow(2).sum(dim=(1, 3)).sqrt()


def cls_attn_score(info: AttnInfo, prefix: int) -> torch.Tensor:
    """ATS significance: cls attention summed over heads, times the value norm."""
    return _normalise(info.cls_attn[:, :, prefix:].sum(dim=1) * _value_norm(info, prefix))


def entropy_score(info: AttnInfo, prefix: int) -> torch.Tensor:
    """Entropy of each token's own attention row (mean over heads), times its value norm."""
    a = info.attn[:, :, prefix:]  # rows of the patch tokens: [B, h, Np, N]
    entropy = -(a * (a + EPS).log()).sum(dim=-1).mean(dim=1)
    return _normalise(entropy * _value_norm(info, prefix))


def average_score(info: AttnInfo, prefix: int) -> torch.Tensor:
    """Cls attention averaged over heads (no value norm)."""
    return _normalise(info.cls_attn[:, :, prefix:].mean(dim=1))
