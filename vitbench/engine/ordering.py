"""The order of scores from highest to lowest, equal scores by position (ToMe Sec. 3.1's edge
order; the kept tokens of pruning, docs/methods.md, "PPT").

Compiled for a CPU, the stable sort that gives this order costs ToMe about 1 % of its
forward at batch 1 (docs/measuring.md, "Batch 1 on a CPU"), so there float32 scores are sorted
as unique integer keys by the unstable sort, whose key arithmetic inductor fuses into the
kernel before it: the same order, since no two keys tie. In eager mode the extra operations
cost more than the stable sort, which stays."""
from __future__ import annotations

import torch

__all__ = ["descending_order"]


def descending_order(scores: torch.Tensor) -> torch.Tensor:
    """Indices that sort ``scores [..., n]`` along the last dimension, highest first, equal
    scores in index order: ``scores.argsort(dim=-1, descending=True, stable=True)``."""
    compiled_cpu = torch.compiler.is_compiling() and scores.device.type == "cpu"
    if not compiled_cpu or scores.dtype != torch.float32:
        return scores.argsort(dim=-1, descending=True, stable=True)
    return _by_integer_keys(scores)


def _by_integer_keys(scores: torch.Tensor) -> torch.Tensor:
    """:func:`descending_order` of float32 ``scores`` by an unstable sort of unique int64 keys."""
    n = scores.shape[-1]
    # -0.0 + 0.0 is 0.0, equal to 0.0 as in sort; every NaN becomes the positive one, which sorts highest
    bits = torch.where(scores.isnan(), float("nan"), scores + 0.0).view(torch.int32)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # int32 order = float order
    rank = torch.arange(n - 1, -1, -1, device=scores.device)  # the earlier index, the larger key
    return (bits.to(torch.int64) * n + rank).argsort(dim=-1, descending=True)
