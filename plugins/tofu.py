"""ToFu: Token Fusion (Kim, Gao, Hsu, Shen, Jin, "Token Fusion: Bridging the Gap between Token
Pruning and Token Merging", WACV 2024; arXiv 2312.01026). Training-free.

ToFu keeps ToMe's bipartite soft matching (docs/methods.md §1: head-averaged keys, cosine
similarity, sets A/B alternating by position, ``r`` tokens per block with ToMe's schedule forms
and its cap ``(N - prefix) // 2``) and changes only what a matched group becomes:

- **Prune blocks** (the first ``prune_layers`` blocks; the paper's "pruned merging"). The
  paper measures the *functional linearity* of each block (how far the output of an
  interpolated input is from the interpolation of the outputs) and finds the early blocks far
  from linear, so an averaged token is an input they were never trained on. There the matched
  A tokens are *pruned into* their partners: each destination B token keeps its own value,
  unchanged. The sizes (and, when tracing, the sources) of the pruned A tokens still add to
  their destination's, so proportional attention counts the destination as all the patches it
  now stands for and unmerge maps the pruned patches to it.
- **Merge blocks** (all later blocks; "MLERP merging"). Averaging shrinks the norm of a group
  of tokens that do not point the same way, a shift of the feature-norm distribution the later
  blocks have not seen. MLERP ("maximum-norm linear interpolation", the paper's generalisation
  of SLERP to several tokens) keeps the direction of the average and gives it the largest
  member norm::

      MLERP(x_1..x_n) = (xbar / ||xbar||) * max_i ||x_i||,   xbar = sum_i s_i x_i / sum_i s_i

  with ``s_i`` the sizes (the direction is ToMe's size-weighted average). Tokens that merge
  with nothing are left as ToMe leaves them.
- **The boundary** (the paper's hybrid rule "PRUNE if l < d, else MLERP"): ``prune_layers``
  is ``d``. The paper's ablation finds ``d = 6`` best for the 12-block ViT-B (and that the
  order matters: prune-then-merge beats merge-then-prune); the default ``prune_layers=None``
  is half the blocks, ``depth // 2`` -- ``d = 6`` on 12-block models (DeiT/ViT-S/B).

Sources (checked 2026-11): the paper's equations as reproduced by a reading note of it
(Dayoung-Kil/Dayoung-Kil.github.io ``_posts/2023-08-01-tofu.md``: functional linearity, the
hybrid rule, MLERP with ``xbar = (1/K) sum_k x_k`` and ``max_k ||x_k||``, the ``d = 6``
ablation); the PDF itself could not be read from here. No official code is published. Two
re-implementations (hchautran/PiToMe ``algo/tofu/merge.py``; Westlake-AI/OpenToMe
``opentome/tome/tome.py``, the same code) were run side by side with this module: same
matching, bit-identical prune blocks; their MLERP divides the average by the norm of the
*destination's own input* instead of the average's, so their fused token does not get the
largest member norm (it can exceed it) -- we follow the paper's formula. Their split is
``prune if i <= depth // 2`` (7 of 12 blocks; the paper's ``l < d`` gives 6).

Choices where the paper is silent, or where we differ from it (written down here):

- **The norm rule: the max of the members' norms, unweighted** -- the paper's MLERP (and
  blester125/git-theta's MLERP for model merging, ``merges/slerp.py``). For identical tokens
  MLERP returns that token (tested).
- **The direction is size-weighted** (ToMe's average, ``s_i``), where the paper writes the
  plain mean ``1/K`` and the re-implementations use an unweighted ``scatter_reduce("mean")``;
  the two agree whenever the members of a group have equal sizes.
- **Sizes add in prune blocks** (the pruned patch is represented by its destination);
  proportional attention is on by default as in ToMe (``prop_attn=True``). The paper does not
  say; the re-implementations never update sizes in ToFu blocks (so their proportional
  attention is a no-op).
- **Degenerate groups**: a group whose average is the zero vector (members that cancel
  exactly) has no direction; it stays zero (the norm is clamped to the dtype's ``tiny``
  before dividing, so nothing becomes NaN).
- The matching runs without gradients (ToMe's); gradients flow through the merge. Output
  layout is ToMe's: prefix tokens, the unmatched A tokens in order, then the B tokens.

The reducer needs only the block's keys (``needs={"keys"}``) and the token state, and assumes
no class token beyond ``state.prefix``, so a backbone adapter without one (prefix 0) can reuse
:class:`ToFuReducer` as it is. Cost: ToMe's matching (an ``|A| x |B|`` similarity per block)
plus, in merge blocks, one norm per token; the token counts -- hence GMACs -- equal ToMe's at
the same ``r``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, Matching, TokenState, bipartite_soft_matching, max_merge
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench_plugins.tome import schedule

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


class ToFuReducer:
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
