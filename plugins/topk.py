"""Top-k token pruning by a significance scorer (EViT without/with fusion; docs/methods.md §4).

At each listed block, keep the ``ceil(keep * (N - prefix))`` patch tokens with the highest
scores (prefix tokens always kept, original order kept). With ``fuse=True`` (EViT), the dropped
tokens are fused into one extra token appended at the end: the score-weighted *sum* of the
dropped tokens, with scores normalised over all patch tokens (EViT sums with the raw cls
attention, which also sums to about one), standing for all the patches they stood for.

Order of the kept tokens: EViT's code lays them out by score, highest first (``topk`` with
``sorted=True``, then a gather); vitbench keeps their original order. Unlike PPT's pooling
(docs/methods.md §3), nothing after a top-k step depends on token positions -- attention,
LayerNorm and MLP act on tokens as a set, and the class-token readout and the size-weighted
average pool do not see the order -- so both layouts give the same tokens, counts and logits
(tested to 1e-5); the original order is kept as the one easier to read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction
from vitbench.engine import AttnInfo, Reducer, TokenState
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.kit import check_layers, check_scorer, top_tokens
from vitbench.plugins import get_host


@dataclass(frozen=True)
class TopKParams:
    """``keep`` fraction of patch tokens kept at each of ``layers``; ``fuse`` adds EViT's token."""

    keep: float = 0.7
    layers: tuple[int, ...] = (3, 6, 9)
    score: str = "cls-attn"
    fuse: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"topk.keep={self.keep} is out of range; it must be in (0, 1]")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"topk.layers={list(self.layers)}: block indices are >= 0")
        check_scorer("topk", self.score)


class TopKReducer(Reducer):
    def __init__(self, keep: float, fuse: bool, scorer) -> None:  # type: ignore[no-untyped-def]
        self.keep_ratio = keep
        self.fuse = fuse
        self.scorer = scorer
        self.needs = frozenset(scorer.needs)

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        patches = x.shape[1] - prefix
        k = math.ceil(self.keep_ratio * patches)
        if k >= patches:
            return x
        scores = self.scorer.score(info, prefix)
        index = top_tokens(scores, k, prefix)
        if not self.fuse:
            return state.keep(x, index)
        dropped = torch.ones_like(scores, dtype=torch.bool).scatter_(1, index[:, prefix:] - prefix, False)
        weights = (scores * dropped)[..., None]  # [B, Np, 1]
        token = (x[:, prefix:] * weights).sum(dim=1, keepdim=True)
        size = (state.sizes(x)[:, prefix:] * dropped[..., None]).sum(dim=1, keepdim=True)
        source = None
        if state.source is not None:
            source = (state.source[:, prefix:] * dropped[..., None]).sum(dim=1, keepdim=True)
        x = state.keep(x, index)
        return state.append(x, token, size, source)


def build(params: TopKParams, info: ModelInfo) -> Reduction:
    check_layers("topk", params.layers, info.depth)
    scorer = get_host().scorer(params.score)
    reducers = [TopKReducer(params.keep, params.fuse, scorer) if i in params.layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="topk",
        kind="pruning",
        params=TopKParams,
        build=build,
        families=("vit",),
        needs_attention_probs=True,
        # the fraction of patch tokens kept at each listed block: more keep, more GMACs
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="top-k pruning by a scorer at listed blocks; fuse=True adds EViT's fused token",
    ))
