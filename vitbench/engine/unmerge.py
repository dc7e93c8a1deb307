"""Unmerge: the full token grid back from reduced tokens (methods.md §0, "Unmerge").

Dense tasks need an ``H x W`` feature map. With source tracing on, every current token knows
which original tokens it covers; each original position takes the value of the token that
covers it now, and a pruned position takes its last value before it was pruned.
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
    covers = (state.source > 0).to(x.dtype)
    values = torch.einsum("btp,btc->bpc", covers, x)
    covered = covers.sum(dim=1)[..., None] > 0
    return torch.where(covered, values, state.fill)


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
