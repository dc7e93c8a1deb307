"""ToFu: Token Fusion, training-free (Kim, Gao, Hsu, Shen, Jin, "Token Fusion: Bridging the Gap
between Token Pruning and Token Merging", WACV 2024; arXiv 2312.01026; docs/methods.md §10).

ToFu keeps ToMe's bipartite soft matching (docs/methods.md §1) and changes only what a matched
group becomes. In the first ``prune_layers`` blocks (the paper's "pruned merging", for blocks
far from functionally linear) the matched A tokens are pruned into their partners, which keep
their own value while sizes and sources still add. In later blocks MLERP keeps the direction
of the size-weighted average and gives it the largest member norm:
``MLERP(x_1..x_n) = xbar / ||xbar|| * max_i ||x_i||``. Token counts, hence GMACs, equal ToMe's.

Parameters: ``r`` (ToMe's schedule forms), ``prune_layers`` (the paper's boundary ``d``;
``None``: ``depth // 2``), ``prop_attn``, ``trace_source``. The reducer needs only the keys and
no class token beyond ``state.prefix``, so other backbone adapters can reuse it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, Matching, Reducer, TokenState, bipartite_soft_matching, max_merge
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.kit import schedule

#: what a ToFu block does with a matched group (module docstring)
FUSIONS = ("prune", "mlerp")
Fusion = Literal["prune", "mlerp"]


@dataclass(frozen=True)
class ToFuParams:
    """``r``: tokens removed per block (ToMe's forms: an int, a per-block list, or
    ``(r, inflect)``); ``prune_layers``: how many leading blocks prune-by-merge, the rest merge
    with MLERP (the paper's ``d``; ``None``: half the blocks, ``depth // 2``, the paper's
    ``d = 6`` on 12 blocks); ``prop_attn``: proportional attention; ``trace_source``: keep
    sources (unmerge)."""

    r: Union[int, list[int], tuple[int, float]] = 16
    prune_layers: Optional[int] = None
    prop_attn: bool = True
    trace_source: bool = False

    def __post_init__(self) -> None:
        check_r(self.r)
        layers = self.prune_layers
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 0):
            raise ParamError(f"tofu.prune_layers={self.prune_layers!r} is out of range; it must be an "
                             f"integer >= 0 (the number of leading blocks that prune; 0: MLERP everywhere) "
                             f"or None (half the blocks)")


def check_r(r: object) -> None:
    """Raise a ParamError unless ``r`` is one of ToMe's schedule forms with counts >= 0."""
    if isinstance(r, tuple):
        if len(r) != 2 or isinstance(r[0], bool) or not isinstance(r[0], int):
            raise ParamError(f"tofu.r={r!r}: a schedule is (r, inflect), e.g. (13, -0.5)")
        values: list[object] = [r[0]]
    else:
        values = list(r) if isinstance(r, list) else [r]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ParamError(f"tofu.r={r!r} is out of range; it must be an integer >= 0 "
                         f"(or a list of them, one per block, or (r, inflect))")


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


# -- the fusion rules ------------------------------------------------------------------------


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


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="tofu",
        kind="hybrid",
        params=ToFuParams,
        build=build,
        families=("vit", "swin"),
        # r tokens removed per block, as ToMe: more r, fewer GMACs (same counts as ToMe)
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="ToFu: ToMe matching; prune-by-merge in the first blocks, norm-preserving MLERP "
                    "merge later (training-free)",
    ))
