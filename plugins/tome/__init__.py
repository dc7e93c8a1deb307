"""ToMe: token merging by bipartite soft matching (Bolya et al., ICLR 2023; docs/methods.md, "ToMe").

Training-free. In every block, after the attention residual and before the MLP, ``r`` tokens
are merged into their most similar partners (cosine similarity of the head-averaged keys),
size-weighted; proportional attention adds ``log(size)`` to the attention logits.

Choices: ``r`` per layer is capped at ``(N - prefix) // 2``; prefix tokens (cls, dist,
registers) are neither sources nor destinations; ``(r, inflect)`` schedules ``int`` values
linearly from ``r*(1-inflect)`` to ``2r - r*(1-inflect)``.

Hybrids (MobileViT): the schedule runs over all ``info.depth`` blocks, the
token state restarts with every token sequence (one per MobileViT block), so the cap applies
per sequence (a 16-token sequence merges at most 8, then 4, 2; a 1-token one not at all), and
the family adapter unmerges each sequence back to its full map (docs/methods.md, "The hook point", "Unmerge").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, hookimpl, patch_count


@dataclass(frozen=True)
class ToMeParams:
    """``r``: tokens removed per block — an int, a per-block list, or ``(r, inflect)``."""

    r: Union[int, list[int], tuple[int, float]] = field(default=16, metadata={HELP: (
        "tokens merged per block: one int, one per block, or (r, inflect) for a linear schedule")})
    prop_attn: bool = field(default=True, metadata={HELP: "proportional attention: add log(size) to the logits"})
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if isinstance(self.r, tuple):
            if len(self.r) != 2 or not isinstance(self.r[0], int):
                raise ParamError(f"tome.r={self.r!r}: a schedule is (r, inflect), e.g. (13, -0.5)")
            values = [self.r[0]]
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"tome.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="tome",
        kind="merging",
        params=ToMeParams,
        build="vitbench_plugins.tome.reduction:build",
        # r tokens merged per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="ToMe: bipartite soft matching, r tokens merged per block (training-free)",
    ))
