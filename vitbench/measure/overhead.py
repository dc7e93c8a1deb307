"""A token method's own time: what a forward of the reduced model costs beyond the unpatched blocks
run on its token counts (:class:`~vitbench.measure.limit.TokenCountLimit`), i.e. its scoring,
matching, merging, gathering and unmerging (UniPruneBench's "method overhead").

Timed in turn with the limit, one forward of each per round on the same input
(:func:`~vitbench.measure.paired.measure_paired_speedup`); the overhead is ``1 - limit seconds /
method seconds`` at the median round, as a share of the method's forward, and in milliseconds per
forward at the batch size from the method's own throughput. docs/measuring.md, "The method's own time".
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vitbench.measure.limit import TokenCountLimit, token_counts
from vitbench.measure.paired import measure_paired_speedup
from vitbench.measure.precision import DEFAULT_PRECISION

__all__ = ["has_limit", "measure_overhead"]


def has_limit(model: nn.Module) -> bool:
    """Whether the unpatched model has a token-count limit to time against (a timm ViT)."""
    return hasattr(model, "blocks") and hasattr(model, "patch_embed") and hasattr(model, "_pos_embed")


def measure_overhead(reduced: nn.Module, unreduced: nn.Module, batch_size: int, input_size: tuple[int, int, int],
                     *, method_ms: float, device: str = "cpu", rounds: int = 10,
                     precision: str = DEFAULT_PRECISION, images: Optional[torch.Tensor] = None) -> dict[str, Any]:
    """The record fields (``overhead_*``) of ``reduced``'s time beyond its limit at ``batch_size``:
    the share of its forward in percent (median and IQR over ``rounds``), the same in ms per
    forward of ``method_ms``, and the load facts and mark of the paired rounds."""
    x = images[:batch_size] if images is not None and len(images) >= batch_size else None
    probe = x if x is not None else torch.randn(batch_size, *input_size)
    counts = token_counts(reduced, probe.to(next(reduced.parameters()).device))
    limit = TokenCountLimit(unreduced, counts)
    paired = measure_paired_speedup(reduced, limit, batch_size, input_size, device=device, rounds=rounds,
                                    precision=precision, images=images)
    share = 1.0 - paired.speedup  # limit seconds / method seconds: the share of the forward the blocks take
    facts = paired.record_fields("overhead")
    return {"overhead_pct": 100.0 * share, "overhead_spread_pct": 100.0 * paired.spread,
            "overhead_ms": share * method_ms, "overhead_rounds": rounds, "overhead_counts": counts,
            **{k: v for k, v in facts.items() if k != "overhead_spread_ratio"}}
