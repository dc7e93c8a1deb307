"""The EfficientViT family adapter: MIT EfficientViT (Cai et al., ICCV 2023, Sec. 3.1; timm
``EfficientVit``, ``efficientvit_b*``); docs/methods.md, "The hook point", "EfficientViT".

A LiteMLA runs linear attention on BCHW maps. ``describe`` gives one block per LiteMLA in
forward order, the LiteMLAs of a stage one map (a "sequence"). Channel methods (DCS,
docs/methods.md, "DCS"): ``patch`` replaces each ``context_module.main`` by a
:class:`ReducingLiteMLA`, which re-runs the LiteMLA op for op with the reducer's channel hooks
(``observe``, ``selected_heads()``, ``qk`` after the ReLU kernel, ``proj_forward``). Token
methods that merge to a grid (LTM): ``patch`` wraps each ``EfficientVitBlock`` in a
:class:`ReducingEfficientVitBlock`, whose token step sits between the attention and the MBConv
and folds the tokens to the grid the merge declares (docs/methods.md, "EfficientViT").
The state dict keeps timm's keys."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.kit.family import (
    BlockInfo, LiteMLAHooks, ModelInfo, Reducer, Reduction, ReductionContext, RememberInputs, describe_for_patch,
    keep_wrapped_keys
)
from vitbench.errors import UnsupportedError
from vitbench_plugins.efficientvit_family import PROVIDES
from vitbench_plugins.efficientvit_family.channels import BRANCHES
from vitbench_plugins.efficientvit_family.tokens import ReducingEfficientVitBlock, check_token_reducers, half_map

__all__ = ["BRANCHES", "FAMILY", "ReducingEfficientVitBlock", "ReducingLiteMLA", "describe", "last_stage",
           "lite_mla_forward", "matches", "patch"]

FAMILY = "efficientvit"
_OTHER_CLASSES = {
    "EfficientVitMsra": "Microsoft's EfficientViT (efficientvit_m*, cascaded group attention)",
    "EfficientVitLarge": "MIT EfficientViT-L (efficientvit_l*)",
}


def matches(model: nn.Module) -> bool:
    """timm's MIT ``EfficientVit``; also timm's other EfficientViT classes, only so that
    :func:`describe` can refuse them with a message saying why (instead of "no adapter")."""
    from timm.models.efficientvit_mit import EfficientVit

    return isinstance(model, EfficientVit) or type(model).__name__ in _OTHER_CLASSES


def _lite_mla(module: nn.Module) -> nn.Module:
    return module.block if isinstance(module, ReducingLiteMLA) else module


def lite_mlas(model: nn.Module) -> list[tuple[int, str, nn.Module]]:
    """``(stage index, module name, LiteMLA)`` of every LiteMLA in forward order (unwrapped)."""
    from timm.models.efficientvit_mit import EfficientVitBlock

    found = []
    for s, stage in enumerate(model.stages):
        for b, block in enumerate(stage.blocks):
            block = block.block if isinstance(block, ReducingEfficientVitBlock) else block
            if isinstance(block, EfficientVitBlock):
                found.append((s, f"stages.{s}.blocks.{b}.context_module.main",
                              _lite_mla(block.context_module.main)))
    return found


def _input_size(model: nn.Module) -> tuple[int, int]:
    size = getattr(model, "vitbench_input_size", None)
    if size is None:
        size = model.pretrained_cfg["input_size"][1:]
    return int(size[0]), int(size[1])


def _map_size(size: tuple[int, int], reduction: int) -> tuple[int, int]:
    """The map after ``log2(reduction)`` stride-2 layers (kernel 3, padding 1: ``ceil(n/2)``)."""
    while reduction > 1:
        size, reduction = half_map(size), reduction // 2
    return size


def _check_lite_mla(mla: nn.Module, where: str) -> BlockInfo:
    from timm.models.efficientvit_mit import LiteMLA

    if type(mla) is not LiteMLA:
        raise UnsupportedError(f"{where} is a {type(mla).__name__}; the efficientvit family adapter "
                               f"supports timm LiteMLA only")
    in_channels = mla.qkv.conv.in_channels
    total = mla.qkv.conv.out_channels // 3
    if len(mla.aggreg) != BRANCHES - 1 or total != in_channels or total % mla.dim:
        raise UnsupportedError(
            f"{where}: a LiteMLA with {1 + len(mla.aggreg)} branches and {total} q/k/v channels per "
            f"branch for {in_channels} input channels; the efficientvit adapter supports "
            f"{BRANCHES} branches of exactly the input width (timm's EfficientVit)")
    return BlockInfo(dim=in_channels, num_heads=total // mla.dim, num_patches=0, grid=(0, 0))


def describe(model: nn.Module) -> ModelInfo:
    """The uniform description of a timm ``EfficientVit``: one BlockInfo per LiteMLA."""
    name = type(model).__name__
    if name in _OTHER_CLASSES:
        raise UnsupportedError(f"{name} ({_OTHER_CLASSES[name]}) is not supported; the efficientvit "
                               f"family adapter supports timm EfficientVit (MIT EfficientViT, "
                               f"efficientvit_b0..b3) only")
    size = _input_size(model)
    blocks: list[BlockInfo] = []
    stage_before, sequence = None, -1  # the LiteMLAs of one stage are one token sequence
    for stage, where, mla in lite_mlas(model):
        shape = _check_lite_mla(mla, where)
        grid = _map_size(size, int(model.feature_info[stage]["reduction"]))
        first, stage_before = stage != stage_before, stage
        sequence += first
        blocks.append(BlockInfo(dim=shape.dim, num_heads=shape.num_heads, num_patches=grid[0] * grid[1],
                                grid=grid, sequence=sequence, first=first))
    if not blocks:
        raise UnsupportedError(f"{name} has no LiteMLA attention block")
    first = blocks[0]
    return ModelInfo(
        family=FAMILY,
        depth=len(blocks),
        embed_dim=first.dim,
        num_heads=first.num_heads,
        num_prefix_tokens=0,
        num_patches=first.num_patches,
        grid=first.grid,
        global_pool=model.global_pool,
        blocks=tuple(blocks),
        input_size=size,
    )


def lite_mla_forward(mla: nn.Module, x: torch.Tensor, reducer: Reducer) -> torch.Tensor:
    """timm ``LiteMLA.forward`` on ``x [B, C, H, W]`` with ``reducer``'s channel hooks (module
    docstring): ``observe`` first, ``selected_heads()`` before the attention, ``qk`` after the
    ReLU kernel, and ``proj_forward`` instead of ``proj``."""
    b, _, h, w = x.shape
    reducer.observe(mla, x)
    qkv = mla.qkv(x)
    multi_scale_qkv = torch.cat([qkv] + [op(qkv) for op in mla.aggreg], dim=1)
    heads_computed = multi_scale_qkv.shape[1] // (3 * mla.dim)  # not -1: DCS may leave none
    multi_scale_qkv = multi_scale_qkv.reshape(b, heads_computed, 3 * mla.dim, h * w).transpose(-1, -2)
    q, k, v = multi_scale_qkv.chunk(3, dim=-1)
    hooks = reducer if isinstance(reducer, LiteMLAHooks) else None
    heads = hooks.selected_heads() if hooks is not None else None  # positions among the heads qkv/aggreg compute
    if heads is not None:
        q, k, v = q.index_select(1, heads), k.index_select(1, heads), v.index_select(1, heads)
    q = mla.kernel_func(q)
    k = mla.kernel_func(k)
    q, k = reducer.qk(q, k, x.flatten(2).transpose(1, 2))
    v = F.pad(v, (0, 1), mode="constant", value=1.0)
    if v.device.type != "meta":
        with torch.autocast(device_type=v.device.type, enabled=False):
            out = mla._attn(q, k, v)
    else:
        out = mla._attn(q, k, v)
    out = out.transpose(-1, -2).reshape(b, out.shape[1] * mla.dim, h, w)  # not -1: no heads left
    return hooks.proj_forward(mla.proj, out) if hooks is not None else mla.proj(out)


class ReducingLiteMLA(nn.Module):
    """A timm ``LiteMLA`` whose reducer's channel hooks apply (module docstring).

    ``block`` is the LiteMLA, ``reducer`` the method's reducer (an ``nn.Module`` reducer becomes
    a submodule, so its parameters are ``...main.reducer.*``, what the fine-tuning loop trains).
    The state dict has timm's keys (``...main.qkv.conv.weight``, not ``...main.block.qkv...``).
    The context's ``token_counts`` get each LiteMLA's map size ``H*W`` (nothing is reduced) and
    its ``extras`` are reset by the first LiteMLA of every forward.
    """

    needs: frozenset[str] = frozenset()

    def __init__(self, block: nn.Module, index: int, reducer: Optional[Reducer],
                 context: ReductionContext) -> None:
        super().__init__()
        self.block = block
        self.index = index
        self.reducer = reducer
        self._context = context
        keep_wrapped_keys(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self._context
        if self.index == 0:
            ctx.token_counts = []
            ctx.extras = {}
        ctx.token_counts.append(x.shape[-2] * x.shape[-1])
        if self.reducer is None:
            return self.block(x)
        return lite_mla_forward(self.block, x, self.reducer)


def patch(model: nn.Module, reduction: Reduction, method: str = "", params: Any = None) -> nn.Module:
    """Wrap every LiteMLA (channel reducers) or every EfficientVitBlock (token reducers, grid
    merges only) of ``model`` with the reducers of ``reduction``; returns ``model``."""
    info = describe_for_patch(model, reduction, method, describe, PROVIDES, "LiteMLA blocks")
    tokens = any(r is not None and not r.selects_channels for r in reduction.reducers)
    if tokens:
        check_token_reducers(reduction.reducers, method)
    context = ReductionContext(method, params, 0, reduction.prop_attn, reduction.trace_source)
    context.reduction = reduction
    model.register_forward_pre_hook(RememberInputs(context))
    for i, ((_, where, mla), reducer, binfo) in enumerate(zip(lite_mlas(model), reduction.reducers, info.blocks)):
        block_path = where.removesuffix(".context_module.main")  # stages.S.blocks.B
        if tokens:
            stage_blocks, _, b = block_path.rpartition(".")
            blocks = model.get_submodule(stage_blocks)
            blocks[int(b)] = ReducingEfficientVitBlock(blocks[int(b)], i, reducer, context, binfo.first)
        else:
            model.get_submodule(f"{block_path}.context_module").main = ReducingLiteMLA(mla, i, reducer, context)
    model._vitbench_context = context  # see vitbench.engine.block.reduction_context
    return model


def last_stage(model: nn.Module) -> nn.Module:
    """The last stage, whose ``[B, C, H, W]`` output is the final map."""
    return model.stages[-1]

