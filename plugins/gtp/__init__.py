"""GTP: graph-based token propagation, training-free (Xu et al., *GTP-ViT: Efficient Vision
Transformers via Graph-based Token Propagation*, WACV 2024; Sec. 3; docs/methods.md, "GTP").

A graph over the patch tokens is built once per forward (spatial: each patch linked to its
eight neighbours; semantic: to its ``neighbours`` most cosine-similar patches; mixed: both),
normalised as ``D^-1/2 A D^-1/2``. In every block, after the attention residual (docs/methods.md,
"The hook point"), the ``r`` patch tokens that are least important -- the product of the largest
attention any head pays a token from itself and the largest attention it receives in total --
are eliminated, and each kept token ``i`` receives ``alpha * sum_j W_ij x_j`` over the eliminated
``j``: their information propagates along the graph instead of being lost. The graph then keeps
the rows and columns of the kept tokens.

Parameters: ``r`` (tokens eliminated per block, the budget knob), ``alpha``, ``graph``,
``neighbours``, ``trace_source``; the defaults are the official evaluation command's (docs/methods.md, "GTP")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count

#: the graphs over the patch tokens (module docstring)
GRAPHS = ("spatial", "semantic", "mixed")


@dataclass(frozen=True)
class GTPParams:
    """``r``: patch tokens eliminated per block (an int, or one per block); ``alpha``: the weight
    of the propagated features; ``graph``: spatial, semantic or mixed; ``neighbours``: the
    semantic graph's edges per token."""

    r: Union[int, list[int]] = field(default=4, metadata={HELP: "tokens eliminated per block: one int, or one per block"})
    alpha: float = param(0.1, "weight of the features propagated to the kept tokens", range=Range(0))
    graph: str = param("spatial", "the graph the features propagate along: spatial, semantic or mixed", choices=GRAPHS)
    neighbours: int = param(8, "edges per token of the semantic graph (semantic and mixed)", range=Range(1))
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"gtp.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="gtp",
        kind="pruning",
        params=GTPParams,
        build="vitbench_plugins.gtp.reduction:build",
        needs=frozenset({"token_steps", "patch_grid", "attn"}),
        # r tokens eliminated per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="GTP-ViT: eliminate r tokens per block, propagating them along a token graph (training-free)",
    ))
