"""timm's ViT attention, re-run with proportional attention and optional probabilities.

Re-implements ``timm.layers.Attention.forward`` on the module's own submodules (``qkv``,
``q_norm``/``k_norm``, ``norm``, ``gate``, ``proj``), adding what the reducing block needs
(docs/methods.md §0): the ``log(size)`` key bias of proportional attention, passed to SDPA as a float
``attn_mask`` so the fused kernel is kept, and — only when a block's reducer asks — the
head-averaged keys, the values, the cls row of the attention probabilities, or the full matrix.
Only a block that needs the full matrix (``"attn"``) gives up the fused kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

NEEDS = frozenset({"keys", "cls_attn", "attn", "values"})


@dataclass
class AttnInfo:
    """What a block's attention hands to its reducer (each ``None`` unless asked for)."""

    keys: Optional[torch.Tensor] = None  # [B, N, d] keys averaged over heads, before scaling
    cls_attn: Optional[torch.Tensor] = None  # [B, h, N] attention row of token 0
    attn: Optional[torch.Tensor] = None  # [B, h, N, N] attention probabilities
    values: Optional[torch.Tensor] = None  # [B, h, N, d]


def uses_fused_kernel(attn: nn.Module, needs: AbstractSet[str]) -> bool:
    """Whether a block runs SDPA: timm's ``fused_attn`` is on and no full matrix is needed."""
    return bool(getattr(attn, "fused_attn", False)) and "attn" not in needs


QKHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def attention_forward(attn: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor],
                      needs: AbstractSet[str] = frozenset(),
                      qk_hook: Optional[QKHook] = None) -> tuple[torch.Tensor, AttnInfo]:
    """Run timm ``Attention`` module ``attn`` on ``x [B, N, C]`` with key bias ``bias [B,1,1,N]``.

    ``qk_hook(q, k, x) -> (q, k)`` changes the per-head queries and keys ``[B, h, N, d]`` after
    qk-norm (DCS's channel masks, docs/methods.md §7).
    """
    b, n, _ = x.shape
    gate = attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if qk_hook is not None:
        q, k = qk_hook(q, k, x)
    info = AttnInfo()
    if "keys" in needs:
        info.keys = k.mean(dim=1)
    if "values" in needs:
        info.values = v
    if uses_fused_kernel(attn, needs):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=attn.attn_drop.p if attn.training else 0.0)
        if "cls_attn" in needs:
            row = (q[:, :, :1] * attn.scale) @ k.transpose(-2, -1)
            if bias is not None:
                row = row + bias
            info.cls_attn = row.softmax(dim=-1)[:, :, 0]
    else:
        logits = (q * attn.scale) @ k.transpose(-2, -1)
        if bias is not None:
            logits = logits + bias
        probs = logits.softmax(dim=-1)
        if "attn" in needs:
            info.attn = probs
        if "cls_attn" in needs:
            info.cls_attn = probs[:, :, 0]
        out = attn.attn_drop(probs) @ v
    out = out.transpose(1, 2).reshape(b, n, attn.num_heads * attn.head_dim)
    out = attn.norm(out)
    if gate is not None:
        out = out * gate
    out = attn.proj_drop(attn.proj(out))
    return out, info
