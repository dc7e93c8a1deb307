"""The fine-tuning stage most learnable methods declare: AdamW on a cosine schedule, its
epochs, learning rate, weight decay and batch size read from the method's parameters; and the
epochs a stage really runs, which its callbacks count against."""
from __future__ import annotations

from typing import Any

from torch import nn

from vitbench.catalog import TrainStage
from vitbench.engine import reduction_context

__all__ = ["adamw_cosine", "stage_epochs"]


def adamw_cosine(name: str, params: Any, **fields: Any) -> TrainStage:
    """A :class:`~vitbench.catalog.TrainStage` named ``name`` from ``params``' ``epochs``, ``lr``,
    ``weight_decay`` (0 when it has none) and ``batch_size``; ``fields``: further stage fields."""
    return TrainStage(name=name, epochs=params.epochs, optimizer="AdamW", lr=params.lr,
                      weight_decay=getattr(params, "weight_decay", 0.0), schedule="cosine",
                      batch_size=params.batch_size, **fields)


def stage_epochs(model: nn.Module, declared: int) -> int:
    """The epochs of the stage ``model`` is training in, as the task runs it (a dense task
    lengthens the last stage to its protocol's epochs), else ``declared``: what a callback that
    acts "after the last epoch" must count against."""
    ctx = reduction_context(model)
    stage = ctx.stage if ctx is not None else None
    return int(stage.epochs) if stage is not None else declared
