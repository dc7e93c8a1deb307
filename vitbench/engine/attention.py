"""timm's ViT attention, re-run with proportional attention and optional probabilities.

Re-implements ``timm.layers.Attention.forward`` on the module's own submodules, adding what the
reducing block needs (docs/methods.md, "The hook point"): the ``log(size)`` key bias of proportional attention
as a float ``attn_mask`` (the fused kernel is kept), and, only when a reducer asks, the
head-averaged keys, the values, the class-token row of the probabilities or the full matrix
(``"attn"``, the one request that gives up the fused kernel). On CUDA in half precision the bias
rides inside the flash kernel as one extra query/key channel (:func:`bias_channel`,
:data:`BIAS_CHANNEL`; docs/measuring.md, "Proportional attention in half precision on CUDA")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

NEEDS = frozenset({"keys", "cls_attn", "attn", "values", "input", "tokens"})


@dataclass
class AttnInfo:
    """What a block's attention hands to its reducer: each field is ``None`` unless the reducer
    lists its name in ``needs`` (:func:`attention_forward` fills it; docs/token-state.md).

    ``B`` images in the batch (MobileViT: its token sequences, ``B*4``), ``N`` tokens now, prefix
    tokens (cls, dist, registers) first, ``h`` heads, ``d`` the head width, ``C = h*d``. Dtype:
    the block's (the model's, or autocast's), except the probabilities under CUDA autocast
    (softmax gives float32). The probabilities include the key bias (``log(size)`` under
    proportional attention; ``-inf`` for padding keys, whose probability is 0).

    - ``keys`` ``[B, N, d]``: the keys after qk-norm, averaged over the heads, not scaled.
    - ``cls_attn`` ``[B, h, N]``: the attention row of token 0 (the class token): the
      probabilities with which it attends to every token, summing to 1 per head.
    - ``attn`` ``[B, h, N, N]``: the full probabilities (query, key), before attention dropout;
      asking for it gives up the fused kernel.
    - ``values`` ``[B, h, N, d]``: the values per head.
    - ``input`` ``[B, N, C]``: the attention's input, the block's normed tokens (DTEM).
    - ``tokens`` ``[B, N, C]``: the block's input before its norm (GTP's semantic graph; the
      reducing block fills it, not the attention).
    """

    keys: Optional[torch.Tensor] = None
    cls_attn: Optional[torch.Tensor] = None
    attn: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    input: Optional[torch.Tensor] = None
    tokens: Optional[torch.Tensor] = None


def uses_fused_kernel(attn: nn.Module, needs: AbstractSet[str]) -> bool:
    """Whether a block runs SDPA: timm's ``fused_attn`` is on and no full matrix is needed."""
    return bool(getattr(attn, "fused_attn", False)) and "attn" not in needs


def head_mean(k: torch.Tensor) -> torch.Tensor:
    """``k [B, h, N, d]`` averaged over its heads, as ``k.mean(dim=1)``; on a CPU the heads are
    added as whole slices, about twice as fast there as the reduction over the strided head axis."""
    heads = k.shape[1]
    if k.device.type != "cpu" or heads == 1:
        return k.mean(dim=1)
    out = k[:, 0] + k[:, 1]
    for i in range(2, heads):
        out.add_(k[:, i])
    return out.div_(heads)


#: when the key bias rides as an extra channel: ``"auto"`` (CUDA fp16/bf16), ``"always"``, ``"never"``
BIAS_CHANNEL = "auto"
_BIAS_CHANNEL_MODES = ("auto", "always", "never")


def set_bias_channel(mode: str) -> str:
    """Set :data:`BIAS_CHANNEL` to ``mode`` (``auto``, ``always`` or ``never``); returns the old mode."""
    global BIAS_CHANNEL
    if mode not in _BIAS_CHANNEL_MODES:
        raise ValueError(f"bias channel mode {mode!r}; valid modes: {', '.join(_BIAS_CHANNEL_MODES)}")
    old, BIAS_CHANNEL = BIAS_CHANNEL, mode
    return old


def bias_channel(q: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether the key bias goes into SDPA as an extra query/key channel (module docstring):
    never for a bias that is not one row per key (``[B, 1, 1, N]``), else as
    :data:`BIAS_CHANNEL` says (``auto``: on CUDA in fp16 or bf16)."""
    if BIAS_CHANNEL == "never" or bias.dim() != 4 or bias.shape[1] != 1 or bias.shape[2] != 1:
        return False
    return BIAS_CHANNEL == "always" or (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16))


def sdpa_with_key_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float,
                       dropout_p: float = 0.0) -> torch.Tensor:
    """``softmax(scale * q k^T + bias) v`` through SDPA with no mask: the key bias ``[B, 1, 1, N]``
    as an extra query/key channel (module docstring). ``-inf`` entries (masked keys) stay
    ``-inf``; a row whose keys are all ``-inf`` is as undefined as with a mask."""
    b, h, n, d = q.shape
    pad = 8 - d % 8  # the bias channel plus zeros up to a multiple of 8
    c = float(scale) ** -0.5
    zeros = q.new_zeros(b, h, n, pad - 1)
    q2 = torch.cat([q, q.new_full((b, h, n, 1), c), zeros], dim=-1)
    key_bias = (bias[:, :, 0, :, None] * c).to(k.dtype).expand(b, h, k.shape[2], 1)
    k2 = torch.cat([k, key_bias, k.new_zeros(b, h, k.shape[2], pad - 1)], dim=-1)
    v2 = torch.cat([v, v.new_zeros(b, h, v.shape[2], pad)], dim=-1)
    out = F.scaled_dot_product_attention(q2, k2, v2, dropout_p=dropout_p, scale=scale)
    return out[..., :d]


QKHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def attention_forward(attn: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor],
                      needs: AbstractSet[str] = frozenset(),
                      qk_hook: Optional[QKHook] = None) -> tuple[torch.Tensor, AttnInfo]:
    """Run timm ``Attention`` module ``attn`` on ``x [B, N, C]`` with key bias ``bias [B,1,1,N]``.

    ``qk_hook(q, k, x) -> (q, k)`` changes the per-head queries and keys ``[B, h, N, d]`` after
    qk-norm (DCS's channel masks, docs/methods.md, "DCS").
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
        info.keys = head_mean(k)
    if "values" in needs:
        info.values = v
    if "input" in needs:
        info.input = x
    # compiled on a CPU, a biased attention is written out: inductor fuses scale, bias and softmax,
    # faster than the CPU flash kernel's float mask (docs/measuring.md, "Batch 1 on a CPU")
    written_out = bias is not None and x.device.type == "cpu" and torch.compiler.is_compiling()
    if uses_fused_kernel(attn, needs) and not written_out:
        dropout_p = attn.attn_drop.p if attn.training else 0.0
        if bias is not None and bias_channel(q, bias):
            out = sdpa_with_key_bias(q, k, v, bias, attn.scale, dropout_p)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        if "cls_attn" in needs:
            row = (q[:, :, :1] * attn.scale) @ k.transpose(-2, -1)
            if bias is not None:
                row = row + bias
            info.cls_attn = row.softmax(dim=-1)[:, :, 0]
    else:
        if written_out:  # the scale after the product, where inductor fuses it into the softmax
            logits = (q @ k.transpose(-2, -1)) * attn.scale
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
