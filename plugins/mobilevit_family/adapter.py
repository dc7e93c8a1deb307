"""The MobileViT family adapter (timm ``ByobNet`` ``mobilevit_xxs/xs/s``; docs/methods.md, "The hook point",
"MobileViT").

A MobileViT block unfolds its map into ``B*4`` token sequences without prefix tokens, runs timm
ViT ``Block``s on them and folds them back. ``patch`` wraps every Block in a
:class:`~vitbench.engine.block.ReducingBlock` (the token state restarts per MobileViT block) and
replaces each MobileViT block's forward by :class:`MobileVitForward`, which folds a declared
grid merge to a smaller map (LTM on conv hybrids), folds an unchanged count as timm does, and
otherwise unmerges by the traced sources first. :func:`sequence_grids` gives the grid each
block sees after the merges before it."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.kit.family import (
    BlockInfo, ModelInfo, ReducingBlock, Reduction, ReductionContext, RememberInputs, describe_for_patch, grid_merge,
    unmerge
)
from vitbench.errors import UnsupportedError
from vitbench_plugins.mobilevit_family import PROVIDES

FAMILY = "mobilevit"
SUPPORTED = "MobileVitBlock with timm ViT Blocks (mobilevit_xxs, mobilevit_xs, mobilevit_s)"

Grid = tuple[int, int]


def _classes() -> tuple[type, type, type]:
    from timm.models.byobnet import ByobNet
    from timm.models.mobilevit import MobileVitBlock, MobileVitV2Block

    return ByobNet, MobileVitBlock, MobileVitV2Block


def matches(model: nn.Module) -> bool:
    """A timm ``ByobNet`` containing MobileViT blocks (v2 included, so that it gets a clear
    "unsupported" from :func:`describe` rather than "no adapter")."""
    byob, v1, v2 = _classes()
    return isinstance(model, byob) and any(isinstance(m, (v1, v2)) for m in model.modules())


def input_size(model: nn.Module) -> Grid:
    """The ``(H, W)`` token grids are computed for: ``model.vitbench_input_size`` (the detection
    task sets it before applying a method), else the model's pretrained-config input size."""
    size = getattr(model, "vitbench_input_size", None)
    if size is None:
        size = model.pretrained_cfg["input_size"][1:]
    return int(size[0]), int(size[1])


def _ceil_div(hw: Grid, s: int) -> Grid:
    return -(-hw[0] // s), -(-hw[1] // s)


def _block_stride(module: nn.Module) -> int:
    """A ByobNet block downsamples at most once (its main path and shortcut by the same factor)."""
    strides = [1]
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.AvgPool2d, nn.MaxPool2d)):
            s = m.stride if isinstance(m.stride, tuple) else (m.stride, m.stride)
            strides.append(int(s[0]))
    return max(strides)


def _mobilevit_maps(model: nn.Module, size: Grid) -> list[tuple[nn.Module, Grid, int]]:
    """``(MobileViT block, the map it sees, stride since the previous MobileViT block)``."""
    _, v1, _ = _classes()
    hw, since, found = size, 1, []
    for s in [m for m in model.stem.modules() if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d))]:
        stride = s.stride if isinstance(s.stride, tuple) else (s.stride, s.stride)
        hw, since = _ceil_div(hw, int(stride[0])), since * int(stride[0])
    for stage in model.stages:
        for blk in stage:
            stride = _block_stride(blk.conv_kxk) if isinstance(blk, v1) else _block_stride(blk)
            if isinstance(blk, v1):
                if stride != 1:
                    raise UnsupportedError(f"a strided MobileVitBlock (stride {stride}) is not supported; "
                                           f"the mobilevit family adapter supports {SUPPORTED}")
                found.append((blk, hw, since))
                since = 1
            hw, since = _ceil_div(hw, stride), since * stride
    return found


def describe(model: nn.Module) -> ModelInfo:
    """One :class:`BlockInfo` per ViT Block (dims, heads, the grid of its MobileViT block's tokens
    at :func:`input_size`); scalar fields from the first Block; unsupported variants raise."""
    from timm.models.vision_transformer import Block

    _, v1, v2 = _classes()
    name = type(model).__name__
    for m in model.modules():
        if isinstance(m, v2):
            raise UnsupportedError(f"{name} contains {type(m).__name__} (mobilevitv2_*: separable linear "
                                   f"attention, not timm ViT Blocks); the mobilevit family adapter "
                                   f"supports {SUPPORTED}")
    size = input_size(model)
    blocks: list[BlockInfo] = []
    for seq, (mvb, hw, since) in enumerate(_mobilevit_maps(model, size)):
        if seq > 0 and since != 2:
            raise UnsupportedError(f"{name}: MobileViT blocks {seq - 1} and {seq} are {since}x apart "
                                   f"(2x expected); the mobilevit family adapter supports {SUPPORTED}")
        ph, pw = mvb.patch_size
        grid = _ceil_div(hw, ph)[0], _ceil_div(hw, pw)[1]
        for j, blk in enumerate(mvb.transformer):
            inner = blk.block if isinstance(blk, ReducingBlock) else blk
            if type(inner) is not Block:
                raise UnsupportedError(f"{name}: transformer block {j} of MobileViT block {seq} is a "
                                       f"{type(inner).__name__}; the mobilevit family adapter supports "
                                       f"{SUPPORTED}")
            blocks.append(BlockInfo(dim=inner.norm1.normalized_shape[0], num_heads=inner.attn.num_heads,
                                    num_patches=grid[0] * grid[1], grid=grid, sequence=seq, first=j == 0))
    if not blocks:
        raise UnsupportedError(f"{name} has no MobileViT transformer blocks; supported: {SUPPORTED}")
    first = blocks[0]
    return ModelInfo(family=FAMILY, depth=len(blocks), embed_dim=first.dim, num_heads=first.num_heads,
                     num_prefix_tokens=0, num_patches=first.num_patches, grid=first.grid,
                     global_pool="avg", blocks=tuple(blocks), input_size=size)


def sequence_grids(info: ModelInfo, shrink: Callable[[int, Grid], Grid]) -> list[tuple[Grid, Grid]]:
    """``(grid seen, grid folded to)`` per MobileViT block when block ``s`` seeing grid ``g``
    folds its tokens to ``shrink(s, g)`` (LTM: ``(H', W')``). A reduced block hands the next one
    a ``2H' x 2W'`` map, halved once before it (checked by :func:`describe`), so the next block
    sees ``ceil(H'/2) x ceil(W'/2)`` tokens; an unreduced one keeps its map."""
    out_map: Optional[Grid] = None  # the map left by the previous block, once it differs from timm's
    plan: list[tuple[Grid, Grid]] = []
    for blk in (b for b in info.blocks if b.first):
        if out_map is None:
            seen, hw = blk.grid, None
        else:
            hw = _ceil_div(out_map, 2)
            seen = _ceil_div(hw, 2)
        folded = tuple(shrink(blk.sequence, seen))
        plan.append((seen, folded))  # type: ignore[arg-type]
        if folded != seen:
            out_map = (2 * folded[0], 2 * folded[1])
        elif hw is not None:
            out_map = hw
    return plan


# -- unfold / fold, exactly as timm's MobileVitBlock.forward -------------------------------------
def unfold(x: torch.Tensor, patch: Grid) -> tuple[torch.Tensor, Grid]:
    """``[B, C, H, W]`` -> tokens ``[B*ph*pw, n_h*n_w, C]`` (bilinear resize to a multiple of the
    patch first, as timm) and ``(n_h, n_w)``."""
    ph, pw = patch
    b, c, h, w = x.shape
    nh, nw = math.ceil(h / ph), math.ceil(w / pw)
    if (nh * ph, nw * pw) != (h, w):
        x = F.interpolate(x, size=(nh * ph, nw * pw), mode="bilinear", align_corners=False)
    x = x.reshape(b * c * nh, ph, nw, pw).transpose(1, 2)
    return x.reshape(b, c, nh * nw, ph * pw).transpose(1, 3).reshape(b * ph * pw, nh * nw, -1), (nh, nw)


def fold(tokens: torch.Tensor, batch: int, grid: Grid, patch: Grid) -> torch.Tensor:
    """Tokens ``[B*ph*pw, n_h*n_w, C]`` on ``grid`` -> ``[B, C, n_h*ph, n_w*pw]``."""
    (nh, nw), (ph, pw) = grid, patch
    c = tokens.shape[-1]
    x = tokens.contiguous().view(batch, ph * pw, nh * nw, -1)
    x = x.transpose(1, 3).reshape(batch * c * nh, nw, ph, pw)
    return x.transpose(1, 2).reshape(batch, c, nh * ph, nw * pw)


def _resize(x: torch.Tensor, hw: Grid) -> torch.Tensor:
    if tuple(x.shape[-2:]) == hw:
        return x
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=False)


class MobileVitForward:
    """The forward of a patched ``MobileVitBlock`` (module doc). A plain object bound to its
    block (set as the instance's ``forward``), not a closure, so ``copy.deepcopy(model)`` gives
    the copy's blocks their own forward and context."""

    def __init__(self, block: nn.Module, context: ReductionContext) -> None:
        self.block = block
        self.context = context

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.block
        shortcut = x
        x = m.conv_1x1(m.conv_kxk(x))
        batch, _, h, w = x.shape
        patch = tuple(m.patch_size)
        tokens, grid = unfold(x, patch)  # type: ignore[arg-type]
        tokens = m.norm(m.transformer(tokens))
        state = self.context.state
        record = grid_merge(state)
        # a grid merge: fold to its grid, merge the shortcut alike (docs/methods.md, "Conv hybrids")
        if record is not None:
            if tokens.shape[1] != record.grid[0] * record.grid[1]:
                raise ValueError(f"{self.context.method}: {tokens.shape[1]} tokens do not fill the "
                                 f"declared {record.grid[0]}x{record.grid[1]} grid")
            x = fold(tokens, batch, record.grid, patch)  # type: ignore[arg-type]
            if m.conv_fusion is not None:
                merged = record.apply(unfold(shortcut, patch)[0])  # type: ignore[arg-type]
                shortcut = fold(merged, batch, record.grid, patch)  # type: ignore[arg-type]
            if record.grid == grid:  # the block's own grid: the map keeps its size, as timm's
                x, shortcut = _resize(x, (h, w)), _resize(shortcut, (h, w))
        else:
            if tokens.shape[1] != grid[0] * grid[1]:  # reduced: the full grid back
                tokens = unmerge(tokens, state)  # type: ignore[arg-type]
            x = fold(tokens, batch, grid, patch)  # type: ignore[arg-type]
            if tuple(x.shape[-2:]) != (h, w):
                x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        x = m.conv_proj(x)
        if m.conv_fusion is not None:
            x = m.conv_fusion(torch.cat((shortcut, x), dim=1))
        return x


def mobilevit_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's ``MobileVitBlock``s in forward order."""
    _, v1, _ = _classes()
    return [m for m in model.modules() if isinstance(m, v1)]


def patch(model: nn.Module, reduction: Reduction, method: str = "", params: Any = None) -> nn.Module:
    """Wrap every ViT Block with the reducers of ``reduction`` and re-route each MobileViT block's
    fold (module doc); returns ``model``. State-dict keys stay timm's."""
    info = describe_for_patch(model, reduction, method, describe, PROVIDES)
    # unmerge needs sources unless every reducer declares its merges as grid merges
    trace = reduction.trace_source or any(r is not None and not r.records_grid_merge for r in reduction.reducers)
    context = ReductionContext(method, params, 0, reduction.prop_attn, trace)
    context.reduction = reduction
    model.register_forward_pre_hook(RememberInputs(context))
    reducers = iter(enumerate(zip(info.blocks, reduction.reducers)))
    for mvb in mobilevit_blocks(model):
        wrapped = []
        for blk in mvb.transformer:
            i, (binfo, reducer) = next(reducers)
            wrapped.append(ReducingBlock(blk, i, reducer, context, starts_sequence=binfo.first))
        mvb.transformer = nn.Sequential(*wrapped)
        mvb.forward = MobileVitForward(mvb, context)
    model._vitbench_context = context  # see vitbench.engine.block.reduction_context
    return model


def last_stage(model: nn.Module) -> nn.Module:
    """The last stage, whose ``[B, C, H, W]`` output is the final map before ``final_conv``."""
    return model.stages[-1]
