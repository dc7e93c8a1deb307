"""ToFu: Token Fusion, training-free (Kim, Gao, Hsu, Shen, Jin, "Token Fusion: Bridging the Gap
between Token Pruning and Token Merging", WACV 2024; arXiv 2312.01026; docs/methods.md, "ToFu").

ToFu keeps ToMe's bipartite soft matching (docs/methods.md, "ToMe") and changes only what a matched
group becomes. In the first ``prune_layers`` blocks (the paper's "pruned merging", for blocks
far from functionally linear) the matched A tokens are pruned into their partners, which keep
their own value while sizes and sources still add. In later blocks MLERP keeps the direction
of the size-weighted average and gives it the largest member norm:
``MLERP(x_1..x_n) = xbar / ||xbar|| * max_i ||x_i||``. Token counts, hence GMACs, equal ToMe's.

Parameters: ``r`` (ToMe's schedule forms), ``prune_layers`` (the paper's boundary ``d``;
``None``: ``depth // 2``), ``prop_attn``, ``trace_source``. The reducer needs only the keys and
no class token beyond ``state.prefix``, so other backbone adapters can reuse it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, hookimpl, patch_count


@dataclass(frozen=True)
class ToFuParams:
    """``r``: tokens removed per block (ToMe's forms: an int, a per-block list, or
    ``(r, inflect)``); ``prune_layers``: how many leading blocks prune-by-merge, the rest merge
    with MLERP (the paper's ``d``; ``None``: half the blocks, ``depth // 2``, the paper's
    ``d = 6`` on 12 blocks); ``prop_attn``: proportional attention; ``trace_source``: keep
    sources (unmerge)."""

    r: Union[int, list[int], tuple[int, float]] = field(default=16, metadata={HELP: (
        "tokens removed per block: one int, one per block, or (r, inflect) for a linear schedule")})
    prune_layers: Optional[int] = field(default=None, metadata={HELP: (
        "leading blocks that prune-by-merge, the rest merge with MLERP (None: depth // 2)")})
    prop_attn: bool = field(default=True, metadata={HELP: "proportional attention: add log(size) to the logits"})
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})

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


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="tofu",
        kind="hybrid",
        params=ToFuParams,
        build="vitbench_plugins.tofu.reduction:build",
        # r tokens removed per block, as ToMe: more r, fewer GMACs (same counts as ToMe)
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="ToFu: ToMe matching; prune-by-merge in the first blocks, norm-preserving MLERP "
                    "merge later (training-free)",
    ))
