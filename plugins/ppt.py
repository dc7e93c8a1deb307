"""PPT: adaptive token pruning and pooling (Wu et al., 2023; docs/methods.md §3).

Training-free. In the listed blocks only, per image: significance scores ``s`` of the patch
tokens (any registered scorer, normalised to sum 1). If ``var(s)`` is below ``threshold`` the
image **pools** (ToMe matching and a size-weighted merge of ``r`` tokens, docs/methods.md §1);
otherwise it **prunes**, keeping the ``N - r`` highest-scoring tokens. Both branches remove
exactly ``r`` (ToMe's cap), so the batch stays rectangular. Other blocks only apply
proportional attention.

Parameters: ``r``, ``layers``, ``threshold``, ``score`` (the scorer), ``order`` (the layout of
the pruned tokens: ``"score"``, highest first as the official code, or ``"original"``). Ties
keep the lower position first. The methods ``entropy`` and ``average`` are PPT with that scorer."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, Reducer, TokenState, bipartite_soft_matching, max_merge
from vitbench.engine.host_sync import host_reads_allowed
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.kit import TOKEN_ORDERS, check_layers, check_scorer, top_tokens
from vitbench.plugins import get_host

#: Layouts of the tokens a pruning step keeps (module docstring).
ORDERS = TOKEN_ORDERS


def check_order(method: str, order: str) -> None:
    """Raise a ParamError naming ``METHOD.order`` and the valid layouts."""
    if order not in ORDERS:
        raise ParamError(f"{method}.order={order!r}; valid orders: {', '.join(ORDERS)}")


@dataclass(frozen=True)
class PPTParams:
    """``r`` tokens removed at each of ``layers`` (0-indexed); ``score`` names a scorer;
    ``order`` lays out the tokens a pruning step keeps (``"score"``: highest first, as the
    official code; ``"original"``: spatial order)."""

    r: int = 50
    layers: tuple[int, ...] = (3, 6, 9)
    threshold: float = 7e-5
    score: str = "cls-attn"
    order: str = "score"

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ParamError(f"ppt.r={self.r} is out of range; r must be >= 0")
        if self.threshold < 0:
            raise ParamError(f"ppt.threshold={self.threshold} is out of range; it must be >= 0")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"ppt.layers={list(self.layers)}: block indices are >= 0")
        check_scorer("ppt", self.score)
        check_order("ppt", self.order)


@dataclass(frozen=True)
class EntropyParams(PPTParams):
    score: str = "entropy"


@dataclass(frozen=True)
class AverageParams(PPTParams):
    score: str = "average"


class PPTReducer(Reducer):
    """Pool or prune ``r`` tokens per image, by the variance of the significance scores."""

    def __init__(self, r: int, threshold: float, scorer,  # type: ignore[no-untyped-def]
                 order: str = "score") -> None:
        self.r = r
        self.threshold = threshold
        self.scorer = scorer
        self.order = order
        self.needs = frozenset({"keys"}) | scorer.needs

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        r = min(self.r, max_merge(x.shape[1], prefix))
        if r <= 0:
            return x
        scores = self.scorer.score(info, prefix)
        pool = scores.var(dim=-1, unbiased=True) < self.threshold  # [B]
        branch_on_host = host_reads_allowed()  # else (CUDA graphs): both branches, selected per image
        if branch_on_host and bool(pool.all()):
            return state.merge(x, bipartite_soft_matching(info.keys, r, prefix))
        prune_index = top_tokens(scores, x.shape[1] - prefix - r, prefix, order=self.order)
        if branch_on_host and not bool(pool.any()):
            return state.keep(x, prune_index)
        return state.merge_or_keep(x, bipartite_soft_matching(info.keys, r, prefix), prune_index, pool)


def build(params: PPTParams, info: ModelInfo) -> Reduction:
    check_layers("ppt", params.layers, info.depth)
    scorer = get_host().scorer(params.score)
    reducers = [PPTReducer(params.r, params.threshold, scorer, params.order) if i in params.layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    for name, params, what in (("ppt", PPTParams, "the scorer given by ppt.score (cls-attn)"),
                               ("entropy", EntropyParams, "the entropy scorer"),
                               ("average", AverageParams, "the average-attention scorer")):
        register(MethodSpec(
            name=name,
            kind="hybrid",
            params=params,
            build=build,
            families=("vit",),
            needs_attention_probs=True,
            # r tokens pooled or pruned at each listed block: more r, fewer GMACs
            budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True),
            description=f"PPT: adaptive pruning or pooling per image, with {what} (training-free)",
        ))
