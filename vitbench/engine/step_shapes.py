"""The token rules a reduction step's shapes alone show (docs/token-state.md): ``batch``, every
image stays; ``growth``, the sequence never grows (a step that ``restores`` may bring it back to the
tokens the forward started with). Comparing shapes needs no device sync, so the reducing blocks
check them on every forward -- timed, counted or scored -- and
:mod:`vitbench.engine.token_rules` checks the rest on the forwards it traces."""
from __future__ import annotations

from typing import Any

import torch

from vitbench.errors import TokenRuleError

__all__ = ["check_step_shapes", "rule_error"]


def rule_error(method: str, block: Any, rule: str, what: str) -> TokenRuleError:
    """The :class:`TokenRuleError` of ``method`` breaking ``rule`` at ``block``."""
    where = f" at block {block}" if block is not None else ""
    return TokenRuleError(f"token rule broken by {method}{where}: {what}", rule=rule, block=block)


def check_step_shapes(method: str, block: Any, x_in: torch.Tensor, x_out: Any, state: Any,
                      restores: bool = False) -> None:
    """Raise :class:`TokenRuleError` if the step ``x_in -> x_out`` of ``block`` drops an image or
    grows the sequence (a step that ``restores`` may return as many tokens as the forward
    started with, ``state.tokens``)."""
    if not isinstance(x_out, torch.Tensor) or x_out.dim() != 3 or x_in.dim() != 3:
        return
    if x_out.shape[0] != x_in.shape[0]:
        raise rule_error(method, block, "batch", f"the step returns {x_out.shape[0]} of its {x_in.shape[0]} images; "
                                                 f"a reduction step keeps every image (docs/token-state.md)")
    if x_out.shape[2] != x_in.shape[2]:
        return  # channels changed: a channel selection, not a token step
    n_in, n_out = x_in.shape[1], x_out.shape[1]
    if n_out > n_in and not (restores and n_out <= state.tokens):
        limit = f", beyond the {state.tokens} the forward started with" if restores else \
            "; a reduction step may only keep, merge or drop tokens"
        raise rule_error(method, block, "growth", f"the sequence grew from {n_in} to {n_out} tokens{limit} "
                                                  f"(docs/token-state.md)")
