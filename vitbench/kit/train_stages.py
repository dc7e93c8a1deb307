"""The fine-tuning stage most learnable methods declare: AdamW on a cosine schedule, its
epochs, learning rate, weight decay and batch size read from the method's parameters."""
from __future__ import annotations

from typing import Any

from vitbench.catalog import TrainStage

__all__ = ["adamw_cosine"]


def adamw_cosine(name: str, params: Any, **fields: Any) -> TrainStage:
    """A :class:`~vitbench.catalog.TrainStage` named ``name`` from ``params``' ``epochs``, ``lr``,
    ``weight_decay`` (0 when it has none) and ``batch_size``; ``fields``: further stage fields."""
    return TrainStage(name=name, epochs=params.epochs, optimizer="AdamW", lr=params.lr,
                      weight_decay=getattr(params, "weight_decay", 0.0), schedule="cosine",
                      batch_size=params.batch_size, **fields)
