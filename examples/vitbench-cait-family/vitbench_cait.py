"""A model-family plugin for timm's CaiT: token methods in its self-attention blocks (the family tutorial)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vitbench.kit import FamilySpec, hookimpl
from vitbench.kit.family import (
    AttnInfo, ModelInfo, Reducer, Reduction, ReductionContext, TokenState, describe_for_patch, keep_wrapped_keys,
)

#: what the adapter hands a method: a token step after each attention, nothing of the attention
PROVIDES = frozenset({"token_steps"})


def matches(model: nn.Module) -> bool:
    """Any timm ``Cait``."""
    from timm.models.cait import Cait

    return isinstance(model, Cait)


def describe(model: nn.Module) -> ModelInfo:
    """CaiT's self-attention blocks see the patch tokens only: the class token joins later."""
    grid = tuple(model.patch_embed.grid_size)
    return ModelInfo(family="cait", depth=len(model.blocks), embed_dim=model.embed_dim,
                     num_heads=model.blocks[0].attn.num_heads, num_prefix_tokens=0,
                     num_patches=grid[0] * grid[1], grid=(grid[0], grid[1]), num_classes=model.num_classes)


class CaitReducingBlock(nn.Module):
    """A CaiT ``LayerScaleBlock`` whose reducer runs after the attention residual, before the MLP."""

    def __init__(self, block: nn.Module, index: int, reducer: Optional[Reducer],
                 context: ReductionContext) -> None:
        super().__init__()
        self.block, self.index, self.reducer, self._context = block, index, reducer, context
        keep_wrapped_keys(self)  # the state dict keeps timm's keys

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blk, ctx = self.block, self._context
        if self.index == 0:  # the first block starts every forward
            ctx.state, ctx.token_counts = TokenState.start(x, 0), []
        x = x + blk.drop_path(blk.gamma_1 * blk.attn(blk.norm1(x)))
        if self.reducer is not None:
            x = self.reducer(x, ctx.state, AttnInfo())
        ctx.token_counts.append(x.shape[1])
        return x + blk.drop_path(blk.gamma_2 * blk.mlp(blk.norm2(x)))


def patch(model: nn.Module, reduction: Reduction, method: str = "", params: Any = None) -> nn.Module:
    """Wrap every self-attention block of ``model`` with its reducer; returns ``model``."""
    describe_for_patch(model, reduction, method, describe, PROVIDES)
    context = ReductionContext(method, params, 0, reduction.prop_attn, reduction.trace_source)
    context.reduction = reduction
    model.blocks = nn.Sequential(*[CaitReducingBlock(blk, i, reducer, context)
                                   for i, (blk, reducer) in enumerate(zip(model.blocks, reduction.reducers))])
    model._vitbench_context = context  # what vitbench.kit.family.reduction_context reads
    return model


def last_block(model: nn.Module) -> nn.Module:
    """The last self-attention block, whose output holds the final patch tokens."""
    return model.blocks[-1]


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="cait",
        matches=matches,
        describe=describe,
        patch=patch,
        feature_module=last_block,
        model_patterns=("cait_*",),
        model_modules=("cait",),
        provides=PROVIDES,
        description="timm CaiT: token methods in the self-attention blocks, before the class attention",
    ))
