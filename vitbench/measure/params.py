"""Parameter count in millions (the ``Params`` column of the report, docs/measuring.md).

All parameters count, trainable or frozen: a frozen backbone still has to be stored and run.
Buffers (e.g. running statistics) are not parameters and are not counted. A parameter shared
between modules counts once (``nn.Module.parameters()`` de-duplicates).
"""
from __future__ import annotations

from torch import nn

from vitbench.measure._common import check_model

__all__ = ["count_params_m"]


def count_params_m(model: nn.Module) -> float:
    """Number of parameters of ``model`` in millions (1e6), e.g. 22.05 for DeiT-S."""
    check_model(model, needs_values=False)
    return sum(p.numel() for p in model.parameters()) / 1e6
