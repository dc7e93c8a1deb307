"""The Swin family adapter: timm ``SwinTransformer`` (V1) and ``SwinTransformerV2`` (Liu et al.,
CVPR 2022, Sec. 3.2-3.3); docs/methods.md, "The hook point", "Swin".

A Swin block attends within windows and the next stage merges 2x2 neighbours, so the map must
keep every token. Each patched block therefore reduces tokens **for the MLP only, one tile at a
time, and unmerges after it** (ToMe for Stable Diffusion, Bolya & Hoffman, CVPRW 2023, Sec. 3): the
(shifted) window attention runs on every token (:func:`window_attention`,
:func:`window_attention_v2`, re-run on timm's modules to hand over the keys), the map is cut
into non-overlapping tiles (:func:`tile_of`), the reducer runs on every tile as a short
sequence without prefix tokens, and the MLP's output goes back to every token
(:func:`unmerge_mlp`, :func:`mlp_branch`; V2 applies ``norm2`` before the unmerge). Budgets are
per tile. A reducer may ask for ``received_attn``, mark removed tokens by size 0 and bring its
own ``unmerge``; a channel reducer (``selects_channels``) has its ``qk`` hook run in every window
(on V2 before the cosine normalisation) and its ``mlp_forward`` on the whole map."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.kit.family import (
    AttnInfo, BlockInfo, ModelInfo, QKHook, Reducer, Reduction, ReductionContext, RememberInputs, ResizeInputs,
    TileUnmerge, TokenState, describe_for_patch, host_reads_allowed, keep_wrapped_keys, tile_of
)
from vitbench.errors import UnsupportedError
from vitbench_plugins.swin_family import PROVIDES

FAMILY = "swin"
SUPPORTED = ("timm SwinTransformer (Swin V1: swin_tiny/small/base/large_patch4_window7/12_*) and "
             "SwinTransformerV2 (swinv2_tiny/small/base/large_window*)")
#: what a Swin block's window attention can hand a reducer (no class token, so no ``cls_attn``)

Grid = tuple[int, int]


def matches(model: nn.Module) -> bool:
    """timm's ``SwinTransformer`` (V1) and ``SwinTransformerV2`` (not ``SwinTransformerV2Cr``,
    timm's other V2, a different class with its own blocks)."""
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    return isinstance(model, (SwinTransformer, SwinTransformerV2))


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Every Swin block in forward order (unwrapped)."""
    return [blk.block if isinstance(blk, SwinReducingBlock) else blk
            for stage in model.layers for blk in stage.blocks]


def describe(model: nn.Module) -> ModelInfo:
    """One :class:`BlockInfo` per Swin block: its width, heads and MLP tile (the token sequence a
    method sees: ``grid`` = :func:`tile_of` its map and window, ``num_patches`` its area; one
    sequence per block) at the size the model was built for."""
    name = type(model).__name__
    blocks: list[BlockInfo] = []
    kinds = _block_types()
    for i, blk in enumerate(_blocks(model)):
        if type(blk) not in kinds:
            raise UnsupportedError(f"block {i} of {name} is a {type(blk).__name__}; the swin family adapter "
                                   f"supports {SUPPORTED}")
        tile = tile_of(tuple(int(s) for s in blk.input_resolution),  # type: ignore[arg-type]
                       tuple(int(s) for s in blk.window_size))  # type: ignore[arg-type]
        blocks.append(BlockInfo(dim=blk.dim, num_heads=blk.attn.num_heads, num_patches=tile[0] * tile[1],
                                grid=tile, sequence=i, first=True))
    if not blocks:
        raise UnsupportedError(f"{name} has no Swin blocks; supported: {SUPPORTED}")
    first = blocks[0]
    size = tuple(int(s) for s in model.patch_embed.img_size)
    patches = tuple(int(s) for s in model.patch_embed.grid_size)
    return ModelInfo(family=FAMILY, depth=len(blocks), embed_dim=first.dim, num_heads=first.num_heads,
                     num_prefix_tokens=0, num_patches=first.num_patches, grid=first.grid,
                     global_pool="avg", blocks=tuple(blocks), input_size=size,  # type: ignore[arg-type]
                     patch_grid=patches, patch_grid_step=2 ** (len(model.layers) - 1))  # type: ignore[arg-type]


def _block_types() -> tuple[type, ...]:
    """The block classes the adapter re-runs: timm's V1 and V2 Swin blocks."""
    from timm.models.swin_transformer import SwinTransformerBlock
    from timm.models.swin_transformer_v2 import SwinTransformerV2Block

    return SwinTransformerBlock, SwinTransformerV2Block


def is_v2(block: nn.Module) -> bool:
    """Whether ``block`` is a Swin V2 block (post-norm, cosine attention; module doc)."""
    from timm.models.swin_transformer_v2 import SwinTransformerV2Block

    return isinstance(block, SwinTransformerV2Block)


# -- windows, exactly as timm's SwinTransformerBlock._attn ------------------------------------------
def to_windows(x: torch.Tensor, window: Grid, shift: Grid) -> tuple[torch.Tensor, Grid]:
    """``[B, H, W, C]`` -> shifted, zero-padded windows ``[B*nW, ws_h*ws_w, C]`` and the padded
    map size ``(Hp, Wp)``."""
    b, h, w, c = x.shape
    if any(shift):
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    pad_h, pad_w = (-h) % window[0], (-w) % window[1]
    x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hp, wp = h + pad_h, w + pad_w
    x = x.view(b, hp // window[0], window[0], wp // window[1], window[1], c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window[0] * window[1], c), (hp, wp)


def from_windows(windows: torch.Tensor, window: Grid, shift: Grid, padded: Grid, size: Grid) -> torch.Tensor:
    """The inverse of :func:`to_windows`: ``[B*nW, ws_h*ws_w, C]`` -> ``[B, H, W, C]``."""
    (hp, wp), (h, w), c = padded, size, windows.shape[-1]
    x = windows.view(-1, hp // window[0], wp // window[1], window[0], window[1], c)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(-1, hp, wp, c)[:, :h, :w]
    if any(shift):
        x = torch.roll(x, shifts=shift, dims=(1, 2))
    return x.contiguous()


@dataclass
class SwinAttnInfo(AttnInfo):
    """:class:`~vitbench.engine.attention.AttnInfo` plus what only the Swin adapter hands over.

    ``received [B*nT, t]``: the attention each token receives as a key, the mean over heads and
    over the queries of its (shifted) window, on the tiles (module doc; ``needs`` ``received_attn``).
    """

    received: Optional[torch.Tensor] = None


def window_attention(attn: nn.Module, x: torch.Tensor, mask: Optional[torch.Tensor],
                     needs: frozenset[str], qk_hook: Optional[QKHook] = None) -> tuple[torch.Tensor, SwinAttnInfo]:
    """timm's ``WindowAttention.forward`` on ``x [B*nW, n, C]`` (relative position bias, the
    shifted-window mask), also handing over the head-averaged keys and the received attention
    per window ``[B*nW, n]`` when ``needs`` asks (the caller moves them onto the tiles);
    ``qk_hook(q, k, x)`` changes the per-head queries and keys first (DCS, docs/methods.md, "DCS").
    A Swin V2 attention goes to :func:`window_attention_v2`."""
    if hasattr(attn, "cpb_mlp"):
        return window_attention_v2(attn, x, mask, needs, qk_hook)
    bw, n, _ = x.shape
    qkv = attn.qkv(x).reshape(bw, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    if qk_hook is not None:
        q, k = qk_hook(q, k, x)
    info = SwinAttnInfo(keys=k.mean(dim=1) if "keys" in needs else None)
    bias = attn._get_rel_pos_bias()  # [1, h, n, n]
    if mask is not None:  # the shifted-window mask, one per window of every image
        nw = mask.shape[0]
        mask = mask.view(1, nw, 1, n, n).expand(bw // nw, -1, attn.num_heads, -1, -1)
        bias = bias + mask.reshape(bw, attn.num_heads, n, n)
    if attn.fused_attn and "received_attn" not in needs:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                             dropout_p=attn.attn_drop.p if attn.training else 0.0)
    else:
        probs = ((q * attn.scale) @ k.transpose(-2, -1) + bias).softmax(dim=-1)
        if "received_attn" in needs:  # mean over heads and the window's queries (no gradient: a score)
            info.received = probs.detach().mean(dim=(1, 2))
        out = attn.attn_drop(probs) @ v
    out = out.transpose(1, 2).reshape(bw, n, -1)
    return attn.proj_drop(attn.proj(out)), info


def window_attention_v2(attn: nn.Module, x: torch.Tensor, mask: Optional[torch.Tensor],
                        needs: frozenset[str], qk_hook: Optional[QKHook] = None) -> tuple[torch.Tensor, SwinAttnInfo]:
    """timm's Swin V2 ``WindowAttention.forward`` on ``x [B*nW, n, C]``, op for op (timm has no
    fused path for it): ``qkv`` with the bias ``(q_bias, k_bias = 0, v_bias)`` (added after the
    projection with ``qkv_bias_separate``), the scaled cosine attention ``cos(q, k) *
    exp(min(logit_scale, log 100))``, the continuous position bias ``16 * sigmoid(cpb_mlp(table))``
    and the shifted-window mask, then softmax, ``A V`` and ``proj``. It hands over

    - ``keys``: the head-averaged *unit* keys ``mean_h k_h / ||k_h||`` -- the keys as the cosine
      attention compares them (it ignores their length, and so does the matching), and
    - ``received`` (``needs`` ``received_attn``): as :func:`window_attention`.

    ``qk_hook(q, k, x)`` (DCS's Q/K mask) runs on the raw per-head queries and keys, *before* the
    cosine normalisation (docs/methods.md, "The hook point", "Swin")."""
    bw, n, _ = x.shape
    heads = attn.num_heads
    if attn.q_bias is None:
        qkv = attn.qkv(x)
    else:
        qkv_bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        if attn.qkv_bias_separate:
            qkv = attn.qkv(x) + qkv_bias
        else:
            qkv = F.linear(x, weight=attn.qkv.weight, bias=qkv_bias)
    q, k, v = qkv.reshape(bw, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    if qk_hook is not None:
        q, k = qk_hook(q, k, x)
    k = F.normalize(k, dim=-1)
    info = SwinAttnInfo(keys=k.mean(dim=1) if "keys" in needs else None)
    logits = F.normalize(q, dim=-1) @ k.transpose(-2, -1)
    logits = logits * torch.clamp(attn.logit_scale, max=math.log(1.0 / 0.01)).exp()
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, heads)
    bias = table[attn.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
    logits = logits + (16 * torch.sigmoid(bias)).unsqueeze(0)
    if mask is not None:  # the shifted-window mask, one per window of every image
        nw = mask.shape[0]
        logits = (logits.view(-1, nw, heads, n, n) + mask.unsqueeze(1).unsqueeze(0)).view(-1, heads, n, n)
    probs = logits.softmax(dim=-1)
    if "received_attn" in needs:  # mean over heads and the window's queries (no gradient: a score)
        info.received = probs.detach().mean(dim=(1, 2))
    out = (attn.attn_drop(probs) @ v).transpose(1, 2).reshape(bw, n, -1)
    return attn.proj_drop(attn.proj(out)), info


def mlp_branch(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The residual MLP branch of a Swin block on tokens ``x``: ``mlp(norm2(x))`` (V1, pre-norm)
    or ``norm2(mlp(x))`` (V2, post-norm: the norm is the branch's last step, so it runs on the
    reduced tokens before the unmerge; docs/methods.md, "The hook point", "Swin")."""
    if is_v2(block):
        return block.norm2(block.mlp(x))
    return block.mlp(block.norm2(x))


class SwinReducingBlock(nn.Module):
    """A timm ``SwinTransformerBlock`` or ``SwinTransformerV2Block`` whose MLP runs on the tiles a
    reducer reduced (module doc).

    Transparent to checkpoints like :class:`~vitbench.engine.block.ReducingBlock`: its state dict
    has timm's keys. Without a reducer it is timm's block, untouched.
    """

    def __init__(self, block: nn.Module, index: int, reducer: Optional[Reducer],
                 context: ReductionContext) -> None:
        super().__init__()
        self.block = block
        self.index = index
        self.reducer = reducer
        self.needs = frozenset(reducer.needs) if reducer is not None else frozenset()
        self._context = context
        keep_wrapped_keys(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self._context
        if self.index == 0:
            ctx.token_counts, ctx.extras = [], {}
        blk = self.block
        b, h, w, c = x.shape
        window, shift = tuple(blk.window_size), tuple(blk.shift_size)
        tile = tile_of((h, w), window)  # type: ignore[arg-type]
        reducer = self.reducer
        if reducer is None:
            ctx.token_counts.append(tile[0] * tile[1])
            return blk(x)
        v2 = is_v2(blk)
        windows, padded = to_windows(x if v2 else blk.norm1(x), window, shift)  # type: ignore[arg-type]
        mask = blk.get_attn_mask(F.pad(x, (0, 0, 0, padded[1] - w, 0, padded[0] - h))) \
            if getattr(blk, "dynamic_mask", False) else blk.attn_mask
        out, info = window_attention(blk.attn, windows, mask, self.needs, reducer.qk)
        out = from_windows(out, window, shift, padded, (h, w))  # type: ignore[arg-type]
        x = x + blk.drop_path1(blk.norm1(out) if v2 else out)
        if reducer.selects_channels:  # a channel method: its MLP hook on every token of the map
            return x + blk.drop_path2(self._channel_step(x, info, reducer))
        tokens, _ = to_windows(x, tile, (0, 0))
        if info.keys is not None:  # the attention's keys, back on the map, then cut into the tiles
            keys = from_windows(info.keys, window, shift, padded, (h, w))  # type: ignore[arg-type]
            info.keys = to_windows(keys, tile, (0, 0))[0]
        if info.received is not None:  # likewise the received attention, one value per token
            received = from_windows(info.received[..., None], window, shift, padded, (h, w))  # type: ignore[arg-type]
            info.received = to_windows(received, tile, (0, 0))[0][..., 0]
        state = TokenState.start(tokens, 0, trace_source=True)
        ctx.state = state
        reduced = reducer(tokens, state, info)
        y, count = _mlp_on_kept(blk, reduced, state)
        ctx.token_counts.append(count)
        back = reducer.unmerge(y, state) if isinstance(reducer, TileUnmerge) else None
        if back is not None:
            y = back
        elif reduced is not tokens:
            y = unmerge_mlp(y, state)
        return x + blk.drop_path2(from_windows(y, tile, (0, 0), (h, w), (h, w)))

    def _channel_step(self, x: torch.Tensor, info: AttnInfo, reducer: Reducer) -> torch.Tensor:
        """A channel method (``selects_channels``): its token step sees the whole map as one
        ``[B, H*W, C]`` sequence and must leave it as it is; its MLP hook runs on the normed map."""
        b, h, w, c = x.shape
        tokens = x.reshape(b, h * w, c)
        self._context.state = TokenState.start(tokens, 0)
        if reducer(tokens, self._context.state, info).shape != tokens.shape:
            raise UnsupportedError(f"method {self._context.method!r} both reduces tokens and runs an MLP "
                                   f"channel hook; the swin family adapter runs one or the other")
        self._context.token_counts.append(h * w)
        if is_v2(self.block):  # post-norm: the hook's MLP on the map itself, norm2 after it
            return self.block.norm2(reducer.mlp_forward(self.block.mlp, x))
        return reducer.mlp_forward(self.block.mlp, self.block.norm2(x))


def _mlp_on_kept(blk: nn.Module, reduced: torch.Tensor, state: TokenState) -> tuple[torch.Tensor, int]:
    """The MLP branch (:func:`mlp_branch`) on ``reduced`` ``[B*nT, n, C]`` and the tokens per
    tile it ran on (the most in any tile). Tokens of size 0 (removed but left in place, module
    doc) are left out -- the branch runs on the others packed into one sequence -- and get a
    zero output (on V2 too: no ``norm2`` of zeros, which would be ``norm2.bias``).

    Where the forward may not read the device (``--cuda-graph``,
    :func:`~vitbench.engine.host_sync.device_only`) the branch runs on every token and the removed
    ones' outputs are zeroed instead: the same values (the branch is per token), with static
    shapes, at the cost of the removed tokens' MLP."""
    size = state.size
    removed = size[..., 0] <= 0 if size is not None else None
    if removed is None:
        return mlp_branch(blk, reduced), reduced.shape[1]
    if not host_reads_allowed():
        y = mlp_branch(blk, reduced)
        return y.masked_fill(removed[..., None], 0.0), reduced.shape[1]
    if not bool(removed.any()):
        return mlp_branch(blk, reduced), reduced.shape[1]
    kept = ~removed
    y = torch.zeros_like(reduced)
    y[kept] = mlp_branch(blk, reduced[kept][None])[0].to(y.dtype)
    return y, int(kept.sum(dim=1).max())


def unmerge_mlp(y: torch.Tensor, state: TokenState) -> torch.Tensor:
    """The MLP outputs of the reduced tiles ``y [B*nT, n, C]`` back on every token of the tiles
    (ToMe for SD's unmerge, Sec. 3): a token takes the output of the token holding the largest share
    of it (:func:`~vitbench.engine.unmerge.unmerge`), and 0 where no token covers it (pruned: no
    MLP update; the residual stream keeps its value)."""
    if state.source is None:
        raise ValueError("the swin adapter's unmerge needs the traced sources")
    share, token = state.source.max(dim=1)
    values = y.gather(1, token[..., None].expand(-1, -1, y.shape[-1]))
    return torch.where(share[..., None] > 0, values, torch.zeros_like(values))


def patch(model: nn.Module, reduction: Reduction, method: str = "", params: Any = None) -> nn.Module:
    """Wrap every Swin block with the reducers of ``reduction`` (module doc); returns ``model``."""
    info = describe_for_patch(model, reduction, method, describe, PROVIDES)
    if reduction.input_grid is not None:
        _feed_smaller(model, reduction.input_grid, info)
    context = ReductionContext(method, params, 0, reduction.prop_attn, True)
    context.reduction = reduction
    model.register_forward_pre_hook(RememberInputs(context))
    reducers = iter(reduction.reducers)
    index = 0
    for stage in model.layers:
        wrapped = []
        for blk in stage.blocks:
            wrapped.append(SwinReducingBlock(blk, index, next(reducers), context))
            index += 1
        stage.blocks = nn.Sequential(*wrapped)
    assert index == info.depth
    model._vitbench_context = context  # see vitbench.engine.block.reduction_context
    return model


def _feed_smaller(model: nn.Module, grid: Grid, info: ModelInfo) -> None:
    """Make ``model`` a model of a ``grid`` of patches (sides multiples of ``patch_grid_step``):
    timm's ``set_input_size`` with every stage's window scaled with the grid, so no window is
    padded (56 -> 48 patches: windows 7 -> 6); every input image is resized to the pixels first."""
    step = info.patch_grid_step
    if grid[0] % step or grid[1] % step:
        raise UnsupportedError(f"a smaller input of {grid[0]}x{grid[1]} patches: this Swin needs sides that are "
                               f"multiples of {step} patches (its stages halve the map {len(model.layers) - 1} times)")
    ph, pw = model.patch_embed.patch_size
    size = (grid[0] * ph, grid[1] * pw)
    model.set_input_size(img_size=size)
    model.register_forward_pre_hook(ResizeInputs(size), prepend=True)


def last_stage(model: nn.Module) -> nn.Module:
    """The last stage, whose ``[B, H, W, C]`` output is the final map before the norm."""
    return model.layers[-1]

