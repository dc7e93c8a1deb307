"""The per-block MAC coefficients of a plain timm ViT, read off its modules (for cost models)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from vitbench.kit.cost import linear_macs

__all__ = ["ViTBlockCosts", "vit_block_costs"]


@dataclass(frozen=True)
class ViTBlockCosts:
    """MACs per token (``linear``, ``mlp``) and per token pair (``quadratic``) of each block."""

    #: the attention's Linear layers (qkv, proj) per token
    linear: tuple[float, ...]
    #: ``QK^T`` and ``A V`` per (query, key) pair: ``2 * heads * head_dim``
    quadratic: tuple[float, ...]
    #: the MLP's Linear layers per token
    mlp: tuple[float, ...]
    #: each block's attention head width
    head_dim: tuple[int, ...]


def vit_block_costs(model: nn.Module, embed_dim: int) -> ViTBlockCosts:
    """The :class:`ViTBlockCosts` of ``model.blocks`` (reducing blocks unwrapped)."""
    blocks = [getattr(blk, "block", blk) for blk in model.blocks]
    head_dim = [int(getattr(blk.attn, "head_dim", embed_dim // blk.attn.num_heads)) for blk in blocks]
    return ViTBlockCosts(
        linear=tuple(linear_macs(blk.attn) for blk in blocks),
        quadratic=tuple(float(2 * blk.attn.num_heads * d) for blk, d in zip(blocks, head_dim)),
        mlp=tuple(linear_macs(blk.mlp) for blk in blocks),
        head_dim=tuple(head_dim),
    )
