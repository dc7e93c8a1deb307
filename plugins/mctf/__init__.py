"""MCTF: multi-criteria token fusion, training-free (Lee, Choi & Kim, "Multi-criteria Token
Fusion with One-step-ahead Attention for Efficient Vision Transformers", CVPR 2024, Sec. 3.2-3.3;
docs/methods.md, "MCTF").

In every block, after the attention residual (docs/methods.md, "The hook point"), ``r`` patch tokens are fused
away on ToMe's schedule and cap: the attraction is the product of similarity (on the tokens),
informativeness (attention received) and size, each raised to ``1/tau`` (Eq. 2); a
bidirectional bipartite soft matching (A -> B, then B -> A reusing the step-1 attraction) picks
the pairs; each group becomes its attention-and-size-weighted mean. The attention map is block
``l``'s own (the paper's one-step-ahead map), but the fusion happens after its residual.

Parameters: ``r`` (int, per-block list or ``(r, inflect)``), ``tau_sim``, ``tau_info``,
``tau_size`` (``0`` switches a criterion off; defaults the paper's DeiT-S setting 1, 20, 40),
``bidirectional``, ``prop_attn``, ``trace_source``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, hookimpl, patch_count


Schedule = Union[int, list[int], tuple[int, float]]


@dataclass(frozen=True)
class MCTFParams:
    """``r``: tokens fused per block -- an int, a per-block list, or ``(r, inflect)`` (ToMe's
    schedule); ``tau_*``: the temperature of each criterion (``0`` switches it off);
    ``bidirectional``: fuse ``r // 2`` A -> B, then the rest B -> A; ``prop_attn``: proportional
    attention; ``trace_source``: keep the sources for unmerge."""

    r: Schedule = field(default=16, metadata={HELP: (
        "tokens fused per block: one int, one per block, or (r, inflect) for a linear schedule")})
    tau_sim: float = field(default=1.0, metadata={HELP: "temperature of the similarity criterion (0 switches it off)"})
    tau_info: float = field(default=20.0, metadata={HELP: (
        "temperature of the informativeness criterion (0 switches it off)")})
    tau_size: float = field(default=40.0, metadata={HELP: "temperature of the size criterion (0 switches it off)"})
    bidirectional: bool = field(default=True, metadata={HELP: "fuse r // 2 tokens A -> B, then the rest B -> A"})
    prop_attn: bool = field(default=True, metadata={HELP: "proportional attention: add log(size) to the logits"})
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})

    def __post_init__(self) -> None:
        _check_r(self.r)
        for name in ("tau_sim", "tau_info", "tau_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ParamError(f"mctf.{name}={value!r} is out of range; it must be a finite number >= 0 "
                                 f"(0 switches the criterion off)")


def _check_r(r: Schedule) -> None:
    if isinstance(r, tuple):
        if len(r) != 2 or not isinstance(r[0], int) or isinstance(r[0], bool):
            raise ParamError(f"mctf.r={r!r}: a schedule is (r, inflect), e.g. (16, -0.5)")
        values = [r[0]]
    else:
        values = [r] if isinstance(r, int) else list(r)
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ParamError(f"mctf.r={r!r} is out of range; it must be an integer >= 0 "
                         f"(or a list of them, one per block, or (r, inflect))")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="mctf",
        kind="merging",
        params=MCTFParams,
        build="vitbench_plugins.mctf.reduction:build",
        needs=frozenset({"token_steps", "attn"}),
        # r tokens fused per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="MCTF: multi-criteria (similarity, informativeness, size) bidirectional token fusion, "
                    "r tokens per block (training-free)",
    ))
