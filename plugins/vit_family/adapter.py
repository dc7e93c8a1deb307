"""The ViT/DeiT family adapter (timm 1.x ``VisionTransformer``, distilled DeiT, register tokens).

``describe`` reads what methods size themselves by; ``patch`` wraps every block in a
:class:`~vitbench.engine.block.ReducingBlock` (all blocks, so proportional attention reaches the
blocks after a reduction) and makes average pooling size-weighted (docs/methods.md, "The hook point", "Pooling").
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vitbench.kit.family import (
    ModelInfo, ReducingBlock, Reduction, ReductionContext, RememberInputs, ResizeInputs, describe_for_patch,
    module_features
)
from vitbench.errors import UnsupportedError
from vitbench_plugins.vit_family import PROVIDES

FAMILY = "vit"
_POOLS = ("token", "avg", "max", "avgmax", "")


def matches(model: nn.Module) -> bool:
    """Any timm ``VisionTransformer`` (and subclasses such as the distilled DeiT)."""
    from timm.models.vision_transformer import VisionTransformer

    return isinstance(model, VisionTransformer)


def describe(model: nn.Module) -> ModelInfo:
    """The uniform description of a timm ViT; unsupported variants raise a clear error."""
    from timm.models.vision_transformer import Block

    name = type(model).__name__
    if getattr(model, "attn_pool", None) is not None:
        raise UnsupportedError(f"{name} with attention pooling (global_pool={model.global_pool!r}) is not "
                               f"supported by token reduction; supported global_pool values: "
                               f"{', '.join(repr(p) for p in _POOLS)}")
    blocks = list(model.blocks)
    for i, blk in enumerate(blocks):
        inner = blk.block if isinstance(blk, ReducingBlock) else blk
        if type(inner) is not Block:
            raise UnsupportedError(f"block {i} of {name} is a {type(inner).__name__}; the ViT family "
                                   f"adapter supports timm Block only")
    grid = tuple(model.patch_embed.grid_size) if getattr(model.patch_embed, "grid_size", None) else (0, 0)
    first = blocks[0].block if isinstance(blocks[0], ReducingBlock) else blocks[0]
    return ModelInfo(
        family=FAMILY,
        depth=len(blocks),
        embed_dim=model.embed_dim,
        num_heads=first.attn.num_heads,
        num_prefix_tokens=model.num_prefix_tokens,
        num_patches=model.patch_embed.num_patches,
        grid=(int(grid[0]), int(grid[1])),
        has_dist_token=getattr(model, "dist_token", None) is not None,
        global_pool=model.global_pool,
        num_classes=int(getattr(model, "num_classes", 0) or 0),
    )


def patch(model: nn.Module, reduction: Reduction, method: str = "", params: Any = None) -> nn.Module:
    """Wrap every block of ``model`` with the reducers of ``reduction``; returns ``model``."""
    info = describe_for_patch(model, reduction, method, describe, PROVIDES)
    if reduction.input_grid is not None:
        _feed_smaller(model, reduction.input_grid)
    context = ReductionContext(method, params, info.num_prefix_tokens, reduction.prop_attn,
                               reduction.trace_source)
    context.reduction = reduction
    model.register_forward_pre_hook(RememberInputs(context))
    model.blocks = nn.Sequential(*[
        ReducingBlock(blk, i, reducer, context)
        for i, (blk, reducer) in enumerate(zip(model.blocks, reduction.reducers))
    ])
    model._vitbench_context = context  # see vitbench.engine.block.reduction_context
    model.pool = _SizeWeightedPool(model, context)
    return model


def _feed_smaller(model: nn.Module, grid: tuple[int, int]) -> None:
    """Make ``model`` a model of a ``grid`` of patches: its position embedding resampled (timm's
    ``set_input_size``) and every input image resized to the matching pixels first."""
    rows, cols = grid
    ph, pw = model.patch_embed.patch_size
    size = (rows * ph, cols * pw)
    model.set_input_size(img_size=size)
    model.register_forward_pre_hook(ResizeInputs(size), prepend=True)


class _SizeWeightedPool:
    """``VisionTransformer.pool`` with averages weighted by token size (docs/methods.md, "The hook point"), and
    maxima over the tokens of size > 0 only: a padded slot (an image that kept fewer tokens than
    its batch's largest count: ATS, LTMP at inference) holds zeros, which would otherwise win a
    max over negative features, and the image would pool differently in a batch than alone."""

    def __init__(self, model: nn.Module, context: ReductionContext) -> None:
        self._pool = type(model).pool.__get__(model)
        self._model_prefix = model.num_prefix_tokens
        self._include_prefix = getattr(model, "pool_include_prefix", False)
        self._default = model.global_pool
        self._context = context

    def __call__(self, x: torch.Tensor, pool_type: Optional[str] = None) -> torch.Tensor:
        pool_type = self._default if pool_type is None else pool_type
        state = self._context.state
        if pool_type not in ("avg", "max", "avgmax") or state is None or state.size is None:
            return self._pool(x, pool_type=pool_type)
        start = 0 if self._include_prefix else self._model_prefix
        tokens, size = x[:, start:], state.size[:, start:]
        if pool_type != "max":
            avg = (tokens * size).sum(dim=1) / size.sum(dim=1)
            if pool_type == "avg":
                return avg
        peak = tokens.masked_fill(size <= 0, float("-inf")).amax(dim=1)  # no host read: graph-safe
        return peak if pool_type == "max" else 0.5 * (peak + avg)


def last_block(model: nn.Module) -> nn.Module:
    """The last transformer block, whose output holds the final patch tokens."""
    return model.blocks[-1]


def final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: the size-weighted mean of the last block's patch tokens (docs/methods.md, "The IB loss")."""
    return module_features(model, last_block(model), images)
