"""PPT: adaptive token pruning and pooling (Wu et al., 2023; docs/methods.md §3).

Training-free. In the listed blocks only, per image: significance scores ``s`` of the patch
tokens (any registered scorer, normalised to sum 1). If ``var(s)`` (unbiased) is below
``threshold`` the scores do not single out tokens, so the image **pools**: ToMe matching and a
size-weighted merge of ``r`` tokens (ToMe's layout: prefix, unmerged A, then B; docs/methods.md
§1); otherwise it **prunes**: keeps the ``N - r`` highest-scoring tokens (prefix first),
carrying their sizes. Both branches remove exactly ``r`` (capped at ``(N - prefix) // 2`` as in
ToMe), so the batch stays rectangular. Other blocks only apply proportional attention.

Layout of the pruned tokens (``order``), docs/methods.md §3:

- ``"score"`` (default): the prefix tokens first and unchanged, then the kept patch tokens
  sorted by score, highest first -- what the official PPT code does (it sorts the scores in
  descending order and keeps the first ``N - r``). Published accuracies come from that layout.
  It matters whenever a later block pools: ToMe's split into sets A and B alternates over the
  *positions* of the current tokens, so the order of the kept tokens decides which tokens can
  be paired. An image that prunes at one listed block and pools at a later one gets different
  logits in the two layouts (5e-2 on a random-weight DeiT-S whose block 3 attends sharply,
  logits of size 1.5). Side by side with the official code on the same weights, the ``"score"``
  layout gives the same token counts and logits to 5e-6 (fp32; the embedded default model and
  a random-weight DeiT-S).
- ``"original"``: the kept patch tokens stay in their original (spatial) order. Token counts,
  FLOPs and the pruned set are the same; only a later pooling step pairs other tokens. Tokens
  sorted by position are easier to read when visualising, and dense tasks that read the token
  sequence in place (rather than through the traced sources, which :func:`unmerge` follows in
  either layout) keep a spatial sequence.

Ties between equal scores keep the lower position first (a stable sort; the official code's
sort is unstable, so exact ties are the one case it cannot be matched bit for bit).

The methods ``entropy`` and ``average`` are PPT with that scorer, as in the thesis (§4).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, TokenState, bipartite_soft_matching, max_merge
from vitbench.engine.host_sync import host_reads_allowed
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.plugins import get_host


def check_scorer(method: str, score: str) -> None:
    """Raise a ParamError naming ``METHOD.score`` and the registered scorers."""
    from vitbench.errors import UnknownNameError

    try:
        get_host().scorer(score)
    except UnknownNameError as exc:
        raise ParamError(f"{method}.score={score!r}: {exc}") from None


def check_layers(method: str, layers: tuple[int, ...], depth: int) -> None:
    """Raise a ParamError naming a block index the model does not have."""
    for layer in layers:
        if not 0 <= layer < depth:
            raise ParamError(f"{method}.layers contains {layer}; valid block indices for this model: "
                             f"0..{depth - 1}")


#: Layouts of the tokens a pruning step keeps (module docstring).
ORDERS = ("score", "original")


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


class PPTReducer:
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


def top_tokens(scores: torch.Tensor, k: int, prefix: int, *, order: str = "original") -> torch.Tensor:
    """Indices ``[B, prefix + k]``: the prefix tokens in place, then the ``k`` best of the patch
    ``scores [B, N - prefix]``, highest first (``order="score"``) or in original order.

    Equal scores keep the lower position first (stable sort), in both layouts.
    """
    if order not in ORDERS:
        raise ValueError(f"order={order!r}; valid orders: {', '.join(ORDERS)}")
    best = scores.sort(dim=-1, descending=True, stable=True).indices[:, :k]
    if order == "original":
        best = best.sort(dim=-1).values
    head = torch.arange(prefix, device=scores.device).expand(scores.shape[0], prefix)
    return torch.cat([head, best + prefix], dim=1)


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
