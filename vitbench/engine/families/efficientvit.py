"""The EfficientViT family adapter: MIT EfficientViT (timm ``EfficientVit``, ``efficientvit_b*``).

EfficientViT (Cai et al., "EfficientViT: Lightweight Multi-Scale Attention for High-Resolution
Dense Prediction", ICCV 2023, Section 3.1) replaces softmax attention by *lightweight
multi-scale linear attention* (timm ``LiteMLA``) on BCHW feature maps: a 1x1 ``qkv`` conv, one
extra branch per aggregation scale (a 5x5 depthwise plus a grouped 1x1 conv on the same q/k/v),
per head and branch a ReLU-kernel linear attention, the branch outputs concatenated and a 1x1
``proj``. There is no token sequence, so token methods (docs/methods.md §0) do not apply; channel
selection does (DCS, docs/methods.md §7: "on EfficientViT: Q/K of each LiteMLA branch, and the
concatenated branch outputs feeding the projection"; the DCS paper's DCS-EfficientViT-B1).

``describe`` gives one :class:`~vitbench.catalog.BlockInfo` per LiteMLA in forward order
(``efficientvit_b1``: 3 in ``stages[2]``, 4 in ``stages[3]``):

- ``dim``: the LiteMLA's input channels ``C`` (what an input-dependent mask reads);
- ``num_heads``: heads *per branch* ``h``; the adapter guarantees ``h * d == C`` (``d =
  dim // num_heads``, timm's ``head_dim``, 16 for b1) and :data:`BRANCHES` branches, so the
  q/k/v width of one branch is ``C`` and the concatenated output feeding ``proj`` has
  ``BRANCHES * C`` channels; other layouts are refused;
- ``grid``/``num_patches``: the map the LiteMLA sees at the description's ``input_size``
  (``model.vitbench_input_size`` when the detection task set one, else the ``pretrained_cfg``
  size): every stride-2 layer (stem, each stage's first block) gives ``ceil(H / 2)``;
- ``sequence = index``, ``first = True``: each LiteMLA is its own "sequence" (no token state
  travels between them).

The scalar fields describe the first LiteMLA; ``num_prefix_tokens`` is 0.

``patch(model, reduction)`` takes one reducer (or ``None``) per LiteMLA and replaces each
``context_module.main`` by a :class:`ReducingLiteMLA`. A reducer for this family acts on
channels through these hooks (each optional; a reducer with neither ``qk`` nor
``proj_forward`` is a token reducer and is refused):

- ``qk(q, k, x) -> (q, k)``: ``q, k [B, H', HW, d]`` the per-head queries and keys of all
  branches, branch-major (heads ``0..h-1`` are the 1x1 branch, ``h..2h-1`` the 5x5
  aggregation branch), **after** the ReLU kernel; ``x [B, HW, C]`` the LiteMLA's input map as
  position tokens. The same shapes as the ViT block's ``qk`` hook
  (:class:`~vitbench.engine.block.ReducingBlock`), so one channel mask serves both. Masking
  after the kernel keeps ``(phi(Q)*M)(phi(K)*M)^T`` -- §7's ``(Q*M)(K*M)^T`` with the linear
  attention's similarity -- and its normaliser ``phi(Q) (phi(K)^T 1)`` consistent (a masked
  channel drops out of both); before the kernel the forward would be the same for a 0/1 mask,
  only the straight-through gradient would pass through the ReLU.
- ``heads_used``: an attribute, ``None`` (all ``H' = BRANCHES * h`` heads) or a sorted
  ``LongTensor`` of heads: the attention runs only for those heads (their q, k, v), ``qk``
  receives only them, and ``proj_forward`` receives only their output channels, in order.
- ``proj_forward(proj, out) -> y``: run instead of ``proj(out)``; ``out [B, H'*d, H, W]`` the
  concatenated branch/head outputs (channel ``t*d + j`` is value channel ``j`` of head ``t``).
- ``head_positions``: an attribute, ``None`` or a ``LongTensor``, for a reducer that has shrunk
  the ``qkv`` and aggregation convolutions to some heads (DCS drops the q/k/v of a head of the
  1x1 branch together with the 5x5-branch head computed from them): the heads ``heads_used``
  are then selected at these positions among the heads still computed.
- ``observe(mla, x)``: called first in every forward with the LiteMLA and its input map (a
  reducer's look at the module it changes: DCS records the shapes its cost model needs).

With ``None`` as reducer the wrapper calls the LiteMLA's own forward (bit-identical to the
unpatched model); with a reducer it re-runs timm's ``LiteMLA.forward`` op for op on the
module's own ``qkv``, ``aggreg``, ``kernel_func``, ``_attn`` and ``proj``. The wrapper is
transparent to checkpoints: the state dict has timm's keys (plus ``...main.reducer.*``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.catalog import BlockInfo, FamilySpec, ModelInfo, Reduction
from vitbench.engine.block import (
    ReductionContext,
    _add_wrapper_level,
    _drop_wrapper_level,
)
from vitbench.engine.families.checks import describe_for_patch
from vitbench.engine.families.vit import _RememberInputs
from vitbench.errors import UnsupportedError

__all__ = ["BRANCHES", "FAMILY", "SPEC", "ReducingLiteMLA", "describe", "lite_mla_forward",
           "matches", "patch"]

FAMILY = "efficientvit"
#: branches of every LiteMLA of timm's EfficientVit: the 1x1 ``qkv`` and one 5x5 aggregation
BRANCHES = 2
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
    h, w = size
    while reduction > 1:
        h, w, reduction = -(-h // 2), -(-w // 2), reduction // 2
    return h, w


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
    blocks = []
    for i, (stage, where, mla) in enumerate(lite_mlas(model)):
        shape = _check_lite_mla(mla, where)
        grid = _map_size(size, int(model.feature_info[stage]["reduction"]))
        blocks.append(BlockInfo(dim=shape.dim, num_heads=shape.num_heads, num_patches=grid[0] * grid[1],
                                grid=grid, sequence=i, first=True))
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


def lite_mla_forward(mla: nn.Module, x: torch.Tensor, reducer: Any) -> torch.Tensor:
    """timm ``LiteMLA.forward`` on ``x [B, C, H, W]`` with ``reducer``'s channel hooks (module
    docstring): ``qk`` after the ReLU kernel, ``heads_used`` before the attention, and
    ``proj_forward`` instead of ``proj``."""
    b, _, h, w = x.shape
    observe = getattr(reducer, "observe", None)
    if observe is not None:
        observe(mla, x)
    qkv = mla.qkv(x)
    multi_scale_qkv = torch.cat([qkv] + [op(qkv) for op in mla.aggreg], dim=1)
    heads_computed = multi_scale_qkv.shape[1] // (3 * mla.dim)  # not -1: DCS may leave none
    multi_scale_qkv = multi_scale_qkv.reshape(b, heads_computed, 3 * mla.dim, h * w).transpose(-1, -2)
    q, k, v = multi_scale_qkv.chunk(3, dim=-1)
    heads = getattr(reducer, "heads_used", None)
    positions = getattr(reducer, "head_positions", None)
    if positions is not None:  # qkv/aggreg compute only some heads: select among those
        heads = positions
    if heads is not None:
        q, k, v = q.index_select(1, heads), k.index_select(1, heads), v.index_select(1, heads)
    q = mla.kernel_func(q)
    k = mla.kernel_func(k)
    qk = getattr(reducer, "qk", None)
    if qk is not None:
        q, k = qk(q, k, x.flatten(2).transpose(1, 2))
    v = F.pad(v, (0, 1), mode="constant", value=1.0)
    if v.device.type != "meta":
        with torch.autocast(device_type=v.device.type, enabled=False):
            out = mla._attn(q, k, v)
    else:
        out = mla._attn(q, k, v)
    out = out.transpose(-1, -2).reshape(b, out.shape[1] * mla.dim, h, w)  # not -1: no heads left
    proj_forward = getattr(reducer, "proj_forward", None)
    return proj_forward(mla.proj, out) if proj_forward is not None else mla.proj(out)


class ReducingLiteMLA(nn.Module):
    """A timm ``LiteMLA`` whose reducer's channel hooks apply (module docstring).

    ``block`` is the LiteMLA, ``reducer`` the method's reducer (an ``nn.Module`` reducer becomes
    a submodule, so its parameters are ``...main.reducer.*``, what the fine-tuning loop trains).
    The state dict has timm's keys (``...main.qkv.conv.weight``, not ``...main.block.qkv...``).
    The context's ``token_counts`` get each LiteMLA's map size ``H*W`` (nothing is reduced) and
    its ``extras`` are reset by the first LiteMLA of every forward.
    """

    needs: frozenset[str] = frozenset()

    def __init__(self, block: nn.Module, index: int, reducer: Optional[Callable[..., Any]],
                 context: ReductionContext) -> None:
        super().__init__()
        self.block = block
        self.index = index
        self.reducer = reducer
        self._context = context
        self._register_state_dict_hook(_drop_wrapper_level)
        self._register_load_state_dict_pre_hook(_add_wrapper_level)

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
    """Wrap every LiteMLA of ``model`` with the reducers of ``reduction``; returns ``model``."""
    describe_for_patch(model, reduction, method, describe, "LiteMLA blocks")
    for reducer in reduction.reducers:
        if reducer is not None and not (hasattr(reducer, "qk") or hasattr(reducer, "proj_forward")):
            raise UnsupportedError(
                f"{method or type(reducer).__name__}: EfficientViT has no token sequence; a reducer for "
                f"the efficientvit family needs the channel hooks qk and/or proj_forward")
    context = ReductionContext(method, params, 0, reduction.prop_attn, reduction.trace_source)
    context.reduction = reduction
    model.register_forward_pre_hook(_RememberInputs(context))
    for i, ((_, where, mla), reducer) in enumerate(zip(lite_mlas(model), reduction.reducers)):
        residual = model.get_submodule(where.rsplit(".", 1)[0])
        residual.main = ReducingLiteMLA(mla, i, reducer, context)
    model._vitbench_context = context  # see vitbench.engine.block.reduction_context
    return model


SPEC = FamilySpec(
    name=FAMILY,
    matches=matches,
    describe=describe,
    patch=patch,
    model_patterns=("efficientvit_b*",),
    description="timm EfficientVit (MIT EfficientViT-B): channel methods on its LiteMLA blocks",
)
