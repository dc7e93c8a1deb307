"""The conformance check every method plugin should pass (docs/architecture.md, method contract).

It checks what the suite relies on: parameters have defaults and reject unknown keys; the
reduced model keeps the output shape; tokens never grow from block to block and end fewer
than they started (for a token method); the forward is deterministic on CPU in eval mode; and
the reducers only ask the attention for what it can hand over.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from vitbench.engine import apply, reduction_context
from vitbench.engine.attention import NEEDS
from vitbench.errors import ParamError
from vitbench.params import make_params
from vitbench.plugins import get_host


def tiny_vit(seed: int = 0, **overrides: Any) -> nn.Module:
    """A tiny random timm ViT (32x32 input, patch 4: 64 patches + cls, 12 blocks) in eval mode.

    Twelve blocks so that methods' default block choices such as (3, 6, 9) exist.
    """
    from timm.models.vision_transformer import VisionTransformer

    kwargs: dict[str, Any] = dict(img_size=32, patch_size=4, in_chans=3, num_classes=10,
                                  embed_dim=48, depth=12, num_heads=3, mlp_ratio=2.0)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return VisionTransformer(**kwargs).eval()


@dataclass
class ConformanceReport:
    """What the check saw: tokens after each block, and the output shape."""

    method: str
    token_counts: list[int]
    output_shape: tuple[int, ...]


def check_method(name: str, params: Optional[dict[str, Any]] = None,
                 model_factory: Callable[[], nn.Module] = tiny_vit,
                 reduces_tokens: bool = True) -> ConformanceReport:
    """Assert that method ``name`` conforms; raise ``AssertionError`` saying what does not."""
    spec = get_host().method(name)
    params = dict(params or {})
    try:
        make_params(spec.name, spec.params, {})  # every parameter has a valid default
    except ParamError as exc:
        raise AssertionError(f"{name}: the default parameters are not valid: {exc}") from exc
    try:
        make_params(spec.name, spec.params, {"no_such_parameter": 1})
    except ParamError:
        pass
    else:
        raise AssertionError(f"{name}: an unknown parameter was accepted")

    base = model_factory()
    x = torch.randn(2, *_input_size(base), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = base(x)
    reduced = apply(copy.deepcopy(base), name, **params)
    context = reduction_context(reduced)
    assert context is not None, f"{name}: apply() did not patch the model"
    for block in reduced.blocks:
        extra = set(getattr(block, "needs", ())) - NEEDS
        assert not extra, f"{name}: block {block.index} asks for {sorted(extra)}; available: {sorted(NEEDS)}"
    with torch.inference_mode():
        first, second = reduced(x), reduced(x)
    assert first.shape == expected.shape, f"{name}: output shape {tuple(first.shape)} != {tuple(expected.shape)}"
    assert torch.equal(first, second), f"{name}: two eval forwards on CPU differ"
    counts = list(context.token_counts)
    n0 = base.patch_embed.num_patches + base.num_prefix_tokens
    assert all(b <= a for a, b in zip([n0] + counts, counts)), f"{name}: tokens grew: {counts}"
    if reduces_tokens:
        assert counts[-1] < n0, f"{name}: tokens did not shrink ({n0} -> {counts})"
    return ConformanceReport(spec.name, counts, tuple(first.shape))


def _input_size(model: nn.Module) -> tuple[int, int, int]:
    img = model.patch_embed.img_size
    return (model.patch_embed.proj.in_channels, int(img[0]), int(img[1]))
