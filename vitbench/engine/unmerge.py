"""Unmerge: the full token grid back from reduced tokens (docs/methods.md, "The hook point", "Unmerge").

Dense tasks need an ``H x W`` feature map. With source tracing on, every current token knows
which original tokens it covers; each original position takes the value of the token that
covers it now, and a pruned position takes its last value before it was pruned. With soft
merges (LTM's convex combinations, where every token holds a little of every position) a
position takes the token holding the largest share of it; with hard merges (ToMe) exactly one
token covers each position, so the two rules agree.
"""
from __future__ import annotations

import torch
from torch import nn

from vitbench.engine.block import reduction_context
from vitbench.engine.token_state import TokenState


def unmerge(x: torch.Tensor, state: TokenState) -> torch.Tensor:
    """Scatter reduced tokens ``x [B, N, C]`` back to the original ``[B, N0, C]`` positions."""
    if state.source is None or state.fill is None:
        raise ValueError("unmerge needs source tracing: call vitbench.engine.enable_source_tracing(model) "
                         "before the forward")
    share, token = state.source.max(dim=1)  # [B, N0]: the token holding most of each position
    values = x.gather(1, token[..., None].expand(-1, -1, x.shape[-1]))
    return torch.where(share[..., None] > 0, values, state.fill)


def enable_source_tracing(model: nn.Module) -> nn.Module:
    """Turn on source tracing of a reduced model (needed by :func:`unmerge`)."""
    context = reduction_context(model)
    if context is None:
        raise ValueError("enable_source_tracing needs a model reduced with vitbench.apply")
    context.trace_source = True
    return model


def last_state(model: nn.Module) -> TokenState:
    """The token state of the model's most recent forward."""
    context = reduction_context(model)
    if context is None or context.state is None:
        raise ValueError("no reduced forward has run on this model yet")
    return context.state
