"""The one generic reducing block that serves every token method (docs/methods.md, "The hook point").

``x = x + ls1(attn(norm1(x)))  ->  reduce(x)  ->  x = x + ls2(mlp(norm2(x)))``

It wraps a timm ``Block`` instance, so LayerScale, drop-path, qk-norm and the attention output
norm stay the block's own modules. The wrapper is transparent to checkpoints: its state dict
has the timm keys (``blocks.3.attn.qkv.weight``, not ``blocks.3.block.attn...``) and it loads
them, so a reduced model and its original share weights files.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vitbench.engine.attention import AttnInfo, attention_forward, uses_fused_kernel
from vitbench.engine.reducer import Reducer
from vitbench.engine.step_shapes import check_step_shapes
from vitbench.engine.token_state import TokenState
from vitbench.errors import PluginError


class ReductionContext:
    """Shared by all reducing blocks of one model: settings and the current forward's state."""

    def __init__(self, method: str, params: Any, prefix: int, prop_attn: bool,
                 trace_source: bool) -> None:
        self.method = method
        self.params = params
        self.prefix = prefix
        self.prop_attn = prop_attn
        self.trace_source = trace_source
        self.state: Optional[TokenState] = None
        self.token_counts: list[int] = []
        #: the :class:`~vitbench.catalog.Reduction` the model was patched with (training hooks)
        self.reduction: Any = None
        #: the current forward's input images (set by a forward pre-hook of the family adapter)
        self.inputs: Optional[torch.Tensor] = None
        #: the current batch's labels while fine-tuning (set by the loop; ``None`` otherwise)
        self.labels: Optional[torch.Tensor] = None
        #: a dense task's per-patch classes ``[B, gh * gw]`` while fine-tuning a plain ViT (``num_classes``: none)
        self.patch_labels: Optional[torch.Tensor] = None
        #: per-forward values methods hand to their ``extra_loss`` (reset by the first block)
        self.extras: dict[str, Any] = {}
        #: the stage being trained as the task runs it (real ``epochs``: kit.stage_epochs); else None
        self.stage: Any = None


def reduction_context(model: nn.Module) -> Optional[ReductionContext]:
    """The reduction context a family adapter attached to a patched model (``None`` if unreduced)."""
    return getattr(model, "_vitbench_context", None)


class ReducingBlock(nn.Module):
    """A timm ViT block with a reduction step between attention and MLP (or, for a reducer
    with ``before_attention``, before the attention).

    Besides the token step ``reducer(x, state, info)``, it calls the reducer's two channel hooks
    (:class:`~vitbench.engine.reducer.Reducer`; identities by default): ``qk(q, k, x)`` on the
    per-head queries and keys ``[B, h, N, d]`` after qk-norm (``x`` the normed block input), and
    ``mlp_forward(mlp, x)`` on the normed tokens instead of ``mlp(x)``.

    The block with ``index == 0`` starts every forward (fresh token counts and extras) and a
    fresh :class:`TokenState`. A hybrid whose blocks run on several token sequences (MobileViT:
    one per MobileViT block) marks the first block of each sequence with
    ``starts_sequence=True``: the token state restarts there, the counts run on.
    """

    def __init__(self, block: nn.Module, index: int, reducer: Optional[Reducer],
                 context: ReductionContext, starts_sequence: Optional[bool] = None) -> None:
        super().__init__()
        self.block = block
        self.index = index
        # a bool, not ``index == 0`` in forward: torch.compile guards on a module's int
        # attributes, which would compile one frame per block wherever a block's frame is compiled
        self.starts_forward = index == 0
        self.starts_sequence = index == 0 if starts_sequence is None else starts_sequence
        self.reducer = reducer  # an nn.Module reducer (learnable methods) becomes a submodule
        self.needs = frozenset(reducer.needs) if reducer is not None else frozenset()
        if reducer is not None and reducer.before_attention and self.needs:
            raise PluginError(f"block {index}: a reducer that runs before the attention gets nothing from it; "
                              f"its needs must be empty, not {sorted(self.needs)}")
        self._context = context
        keep_wrapped_keys(self)

    @property
    def fused(self) -> bool:
        return uses_fused_kernel(self.block.attn, self.needs)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("vitbench reducing blocks do not take an external attention mask")
        ctx = self._context
        new_forward = self.starts_forward or ctx.state is None
        if new_forward or self.starts_sequence:
            ctx.state = TokenState.start(x, ctx.prefix, ctx.trace_source)
        if new_forward:
            ctx.token_counts = []
            ctx.extras = {}
        state = ctx.state
        blk = self.block
        reducer = self.reducer
        early = reducer is not None and reducer.before_attention
        if early:
            x = self._step(x, state, AttnInfo())
        bias = state.bias(x.dtype, ctx.prop_attn)
        qk = reducer.qk if reducer is not None else None
        out, info = attention_forward(blk.attn, blk.norm1(x), bias, self.needs, qk_hook=qk)
        if "tokens" in self.needs:
            info.tokens = x
        x = x + blk.drop_path1(blk.ls1(out))
        if reducer is not None and not early:
            x = self._step(x, state, info)
        ctx.token_counts.append(x.shape[1])
        y = reducer.mlp_forward(blk.mlp, blk.norm2(x)) if reducer is not None else blk.mlp(blk.norm2(x))
        return x + blk.drop_path2(blk.ls2(y))


    def _step(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        """The reducer's token step, its shapes checked on every forward (the batch and growth rules)."""
        out = self.reducer(x, state, info)
        check_step_shapes(self._context.method, self.index, x, out, state, self.reducer.restores)
        return out


def keep_wrapped_keys(wrapper: nn.Module) -> None:
    """Give ``wrapper``'s state dict the keys of the module it wraps as ``wrapper.block`` (its
    ``reducer.*`` keys stay), so a patched model saves and loads the unpatched model's weights."""
    wrapper._register_state_dict_hook(_drop_wrapper_level)
    wrapper._register_load_state_dict_pre_hook(_add_wrapper_level)


def _drop_wrapper_level(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> dict:
    inner = prefix + "block."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    return state_dict


def _add_wrapper_level(state_dict: dict, prefix: str, *args: Any) -> None:
    own = (prefix + "block.", prefix + "reducer.")
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(own)]:
        state_dict[prefix + "block." + key[len(prefix):]] = state_dict.pop(key)
