"""Shared by the LTM-on-hybrid tests (MobileViT, EfficientViT)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.engine import reduction_context


def ltm_training_step(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """One training step of an LTM-reduced ``model`` whose statistics pass has run: the labels
    set for the IB step, cross-entropy plus the stage's IB bound, backward; the gradient of every
    reducer parameter (``None`` where none reached it). Leaves the model in eval mode."""
    ctx = reduction_context(model)
    stage = ctx.reduction.train[0]
    model.train()
    ctx.labels = labels
    logits = model(images)
    loss = F.cross_entropy(logits, labels) + stage.extra_loss(model, logits, labels)
    ctx.labels = None
    loss.backward()
    stage.after[0](model)
    model.eval()
    return {n: p.grad for n, p in model.named_parameters() if ".reducer." in n}
