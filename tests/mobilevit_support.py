"""Shared by the MobileViT adapter and LTM-on-MobileViT tests."""
from __future__ import annotations

import torch
from torch import nn

from vitbench_plugins.mobilevit_family import adapter as mobilevit


def block_output_shapes(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    """The logits of ``model(x)`` and the output shape of each MobileViT block, in order."""
    shapes: list[tuple[int, ...]] = []
    hooks = [b.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
             for b in mobilevit.mobilevit_blocks(model)]
    try:
        with torch.inference_mode():
            logits = model(x)
    finally:
        for h in hooks:
            h.remove()
    return logits, shapes
