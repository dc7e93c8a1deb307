"""The ``tofu`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.tofu`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch

from vitbench.errors import ParamError
from vitbench.kit import (
    AttnInfo, Matching, ModelInfo, Reducer, Reduction, TokenState, bipartite_soft_matching, max_merge, schedule,
)
from vitbench_plugins.tofu import ToFuParams


#: what a ToFu block does with a matched group (module docstring)
FUSIONS = ("prune", "mlerp")
Fusion = Literal["prune", "mlerp"]


def prune_boundary(params: ToFuParams, depth: int) -> int:
    """The paper's ``d``: blocks ``0..d-1`` prune, ``d..`` merge with MLERP. ``prune_layers``,
    or half the blocks when it is None (``depth // 2``: the paper's ``d = 6`` for 12 blocks)."""
    if params.prune_layers is None:
        return depth // 2
    if params.prune_layers > depth:
        raise ParamError(f"tofu.prune_layers={params.prune_layers} is out of range; it must be in "
                         f"0..{depth} for this model's {depth} blocks")
    return params.prune_layers


def block_schedule(params: ToFuParams, depth: int) -> list[tuple[int, Fusion]]:
    """``(r, fusion)`` for each of ``depth`` blocks: "prune" if ``l < d`` else "mlerp"."""
    if isinstance(params.r, list) and len(params.r) != depth:
        raise ParamError(f"tofu.r has {len(params.r)} entries; the model has {depth} blocks")
    d = prune_boundary(params, depth)
    return [(r, "prune" if i < d else "mlerp") for i, r in enumerate(schedule(params.r, depth))]


def with_norm(x: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """``x`` rescaled to length ``norm`` (``[..., 1]``) along the last axis; a zero ``x`` stays zero."""
    length = x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    return x / length * norm


def mlerp_norm(norms: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """The norm MLERP gives a group: the largest of its members' norms ``norms [..., n, 1]``."""
    return norms.amax(dim=dim)


def mlerp(tokens: torch.Tensor, sizes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """MLERP of one group ``tokens [..., n, C]`` (sizes ``[..., n, 1]``, default ones) -> ``[..., C]``:
    the size-weighted average's direction at the largest member norm (module docstring)."""
    if sizes is None:
        sizes = torch.ones_like(tokens[..., :1])
    average = (tokens * sizes).sum(dim=-2) / sizes.sum(dim=-2)
    return with_norm(average, mlerp_norm(tokens.norm(dim=-1, keepdim=True)))


def destinations_kept(x: torch.Tensor, m: Matching) -> torch.Tensor:
    """ToMe's layout of ``x`` after matching ``m`` (prefix, unmatched A, B), every B token keeping
    its own value: the matched A tokens are simply left out (merge-by-prune)."""
    c = x.shape[-1]
    head, rest = x[:, : m.prefix], x[:, m.prefix :]
    a, b = rest[:, m.a_start :: 2], rest[:, 1 - m.a_start :: 2]
    unmatched = a.gather(1, m.unm_idx[..., None].expand(-1, -1, c))
    return torch.cat([head, unmatched, b], dim=1)


def add_sizes(x: torch.Tensor, state: TokenState, m: Matching) -> None:
    """The state's bookkeeping of merging by ``m`` -- prefix check, sizes and sources added --
    without merging any values (:meth:`TokenState.merge` on a zero-width view of ``x``)."""
    state.merge(x[..., :0], m)


def prune_into_partners(x: torch.Tensor, state: TokenState, m: Matching) -> torch.Tensor:
    """Merge-by-prune: destinations keep their values; the sources' sizes add to theirs."""
    add_sizes(x, state, m)
    return destinations_kept(x, m)


def mlerp_merge(x: torch.Tensor, state: TokenState, m: Matching) -> torch.Tensor:
    """Merge by ``m`` with MLERP: each group becomes its size-weighted average rescaled to the
    largest member norm; tokens that merged with nothing are ToMe's (the average of themselves)."""
    norms = x.norm(dim=-1, keepdim=True)
    group_norm = m.merge(norms, mode="amax")  # mlerp_norm over each group, in ToMe's layout
    grouped = m.merge(torch.ones_like(norms), mode="sum") > 1  # destinations that took a source
    average = state.merge(x, m)  # size-weighted; sizes and sources add up
    return torch.where(grouped, with_norm(average, group_norm), average)


class ToFuReducer(Reducer):
    """Remove ``r`` tokens after a block's attention, by ``fusion`` ("prune" or "mlerp")."""

    needs = frozenset({"keys"})

    def __init__(self, r: int, fusion: Fusion) -> None:
        if fusion not in FUSIONS:
            raise ValueError(f"ToFuReducer: fusion={fusion!r}; valid: {', '.join(FUSIONS)}")
        self.r = r
        self.fusion = fusion

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if min(self.r, max_merge(x.shape[1], state.prefix)) <= 0:  # nothing left to match
            return x
        m = bipartite_soft_matching(info.keys, self.r, state.prefix)
        if self.fusion == "prune":
            return prune_into_partners(x, state, m)
        return mlerp_merge(x, state, m)


def build(params: ToFuParams, info: ModelInfo) -> Reduction:
    reducers = [ToFuReducer(r, fusion) if r > 0 else None for r, fusion in block_schedule(params, info.depth)]
    return Reduction(reducers, prop_attn=params.prop_attn, trace_source=params.trace_source)
