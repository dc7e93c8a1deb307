"""Top-k token pruning by a significance scorer (EViT without/with fusion; docs/methods.md, "Token scorers").

At each listed block, keep the ``ceil(keep * (N - prefix))`` patch tokens with the highest
scores (prefix tokens always kept, original order kept). With ``fuse=True`` (EViT), the dropped
tokens are fused into one extra token appended at the end: the score-weighted *sum* of the
dropped tokens, with scores normalised over all patch tokens (EViT sums with the raw cls
attention, which also sums to about one), standing for all the patches they stood for.

Order of the kept tokens: EViT's code lays them out by score, highest first (``topk`` with
``sorted=True``, then a gather); vitbench keeps their original order. Unlike PPT's pooling
(docs/methods.md, "PPT"), nothing after a top-k step depends on token positions -- attention,
LayerNorm and MLP act on tokens as a set, and the class-token readout and the size-weighted
average pool do not see the order -- so both layouts give the same tokens, counts and logits
(tested to 1e-5); the original order is kept as the one easier to read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class TopKParams:
    """``keep`` fraction of patch tokens kept at each of ``layers``; ``fuse`` adds EViT's token."""

    keep: float = param(0.7, "fraction of patch tokens kept at each listed block, in (0, 1]",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "blocks (0-indexed) that prune; None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)", range=Range(0))
    score: str = field(default="cls-attn", metadata={HELP: "the scorer that ranks tokens (vitbench list scorers)"})
    fuse: bool = field(default=False, metadata={HELP: "fuse the dropped tokens into one extra token (EViT)"})

    def __post_init__(self) -> None:
        from vitbench.kit import check_scorer  # the scorers' names: the plugin host

        check_scorer("topk", self.score)


@dataclass(frozen=True)
class EViTParams(TopKParams):
    """EViT (Liang et al., ICLR 2022): top-k with the dropped tokens fused, a preset of ``topk``."""

    fuse: bool = True


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    for name, params, description in (
            ("topk", TopKParams, "top-k pruning by a scorer at listed blocks; fuse=True adds EViT's fused token"),
            ("evit", EViTParams, "EViT: topk with fuse=True, the dropped tokens fused into one (training-free)")):
        register(MethodSpec(
            name=name,
            kind="pruning",
            params=params,
            build="vitbench_plugins.topk.reduction:build",
            needs=frozenset({"token_steps", "cls_attn"}),  # the default scorer: the class token's attention
            # the fraction of patch tokens kept at each listed block: more keep, more GMACs
            budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
            description=description,
        ))
