"""An exponential moving average of the parameters a stage trains, which replaces them when the
stage ends (timm's ``--model-ema``, the model the IBTM authors' harness evaluates)."""
from __future__ import annotations

from typing import Any

import torch
from mmengine.hooks import Hook
from torch import nn

__all__ = ["ParameterEMA"]


class ParameterEMA(Hook):
    """``avg <- decay * avg + (1 - decay) * p`` after every step over ``params``; the averages are
    copied into ``params`` before the stage's own ``after`` callbacks run (a DCS shrink, LTM's
    hook removal), so the stage ends on the averaged weights."""

    priority = "VERY_HIGH"

    def __init__(self, params: dict[str, nn.Parameter], decay: float) -> None:
        self.params, self.decay = list(params.values()), decay
        self.averages: list[torch.Tensor] = []

    def before_train(self, runner: Any) -> None:
        self.averages = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        for avg, p in zip(self.averages, self.params):
            avg.lerp_(p.detach(), 1.0 - self.decay)

    @torch.no_grad()
    def after_train(self, runner: Any) -> None:
        for avg, p in zip(self.averages, self.params):
            p.copy_(avg)
