"""Built-in token significance scorers (docs/methods.md §4; the PPT thesis' score functions).

A scorer maps one block's attention to a significance per patch token ``[B, N - prefix]``,
normalised to sum 1 per image. Attention probabilities include proportional attention, i.e.
they are exactly the probabilities the block used.

- ``cls-attn`` (ATS; the thesis' baseline): ``s_j = (sum_h A[h,0,j]) * ||V_j||_2`` with ``V_j``
  the value of token j over all heads concatenated.
- ``entropy`` (the thesis' "diversity"): ``s_j = mean_h(-sum_t A[h,j,t] log(A[h,j,t]+eps)) * ||V_j||``.
- ``average`` (the thesis' "average attention"): ``s_j = mean_h A[h,0,j]`` (no value norm).
"""
from __future__ import annotations

import torch

from vitbench.catalog import ScorerSpec
from vitbench.engine import AttnInfo
from vitbench.hookspecs import hookimpl

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


@hookimpl
def vitbench_register_scorers(register):  # type: ignore[no-untyped-def]
    register(ScorerSpec("cls-attn", cls_attn_score, frozenset({"cls_attn", "values"}),
                        "ATS: cls attention (sum over heads) x value norm"))
    register(ScorerSpec("entropy", entropy_score, frozenset({"attn", "values"}),
                        "entropy of each token's attention row x value norm"))
    register(ScorerSpec("average", average_score, frozenset({"cls_attn"}),
                        "cls attention averaged over heads"))
