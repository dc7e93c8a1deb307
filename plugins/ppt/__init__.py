"""PPT: adaptive token pruning and pooling (Wu et al., 2023; docs/methods.md, "PPT").

Training-free. In the listed blocks only, per image: significance scores ``s`` of the patch
tokens (any registered scorer, normalised to sum 1). If ``var(s)`` is below ``threshold`` the
image **pools** (ToMe matching and a size-weighted merge of ``r`` tokens, docs/methods.md, "ToMe");
otherwise it **prunes**, keeping the ``N - r`` highest-scoring tokens. Both branches remove
exactly ``r`` (ToMe's cap), so the batch stays rectangular. Other blocks only apply
proportional attention.

Parameters: ``r``, ``layers``, ``threshold``, ``score`` (the scorer), ``order`` (the layout of
the pruned tokens: ``"score"``, highest first as the official code, or ``"original"``). Ties
keep the lower position first. The methods ``entropy`` and ``average`` are PPT with that scorer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count


def check_order(method: str, order: str) -> None:
    """Raise a ParamError naming ``METHOD.order`` and the valid layouts of the tokens a pruning
    step keeps (:data:`vitbench.kit.TOKEN_ORDERS`, module docstring)."""
    # torch: when the method is built; registering the plugin stays light
    from vitbench.kit import TOKEN_ORDERS

    if order not in TOKEN_ORDERS:
        raise ParamError(f"{method}.order={order!r}; valid orders: {', '.join(TOKEN_ORDERS)}")


@dataclass(frozen=True)
class PPTParams:
    """``r`` tokens removed at each of ``layers`` (0-indexed); ``score`` names a scorer;
    ``order`` lays out the tokens a pruning step keeps (``"score"``: highest first, as the
    official code; ``"original"``: spatial order)."""

    r: int = param(50, "tokens pooled or pruned at each listed block", range=Range(0))
    layers: Optional[tuple[int, ...]] = param(None, "blocks (0-indexed) that reduce; None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)", range=Range(0))
    threshold: float = param(7e-5, "pool when the scores' variance is below it, else prune", range=Range(0))
    score: str = field(default="cls-attn", metadata={HELP: "the scorer (vitbench list scorers)"})
    order: str = field(default="score", metadata={HELP: "layout of kept tokens: score (highest first) or original"})

    def __post_init__(self) -> None:
        from vitbench.kit import check_scorer  # the scorers' names: the plugin host

        check_scorer("ppt", self.score)
        check_order("ppt", self.order)


@dataclass(frozen=True)
class EntropyParams(PPTParams):
    score: str = "entropy"


@dataclass(frozen=True)
class AverageParams(PPTParams):
    score: str = "average"


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    for name, params, what, scores_on in (("ppt", PPTParams, "the scorer given by ppt.score (cls-attn)", "cls_attn"),
                                          ("entropy", EntropyParams, "the entropy scorer", "attn"),
                                          ("average", AverageParams, "the average-attention scorer", "cls_attn")):
        register(MethodSpec(
            name=name,
            kind="hybrid",
            params=params,
            build="vitbench_plugins.ppt.reduction:build",
            needs=frozenset({"token_steps", scores_on}),
            # r tokens pooled or pruned at each listed block: more r, fewer GMACs
            budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True),
            description=f"PPT: adaptive pruning or pooling per image, with {what} (training-free)",
        ))
