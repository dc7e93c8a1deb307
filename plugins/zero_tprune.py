"""Zero-TPrune: zero-shot token pruning on the attention graph, training-free (Wang, Dedhia &
Jha, "Zero-TPrune: Zero-Shot Token Pruning through Leveraging of the Attention Graph in
Pre-Trained Transformers", CVPR 2024, §3; docs/methods.md, Zero-TPrune).

Each pruning block (after the attention residual, docs/methods.md §0) removes ``r`` patch
tokens in two stages:

1. **I-stage** (importance). The block's attention probabilities ``A [h, N, N]`` (rows:
   queries, each row sums to 1) are the weighted adjacency matrix of a directed graph on the
   tokens, and a token is important when important tokens attend to it. The *Weighted Page
   Rank* (the paper's Algorithm 1) starts from ``s_0 = 1/N`` for every token and iterates
   ``s_{t+1} = A^T s_t``, i.e. ``s_{t+1}(j) = sum_i A(i, j) s_t(i)``, ``iters`` times. Softmax
   rows are strictly positive, so the chain is irreducible and aperiodic: ``s_t`` stays a
   distribution and converges to the stationary distribution of ``A`` (the left eigenvector of
   eigenvalue 1; no damping factor is needed). The ``r_I`` patch tokens with the lowest score
   are pruned. All ``N`` tokens, prefix tokens included, take part in the graph (the class token
   passes importance on to the patches it attends to); prefix tokens are never pruned.
2. **S-stage** (similarity). The surviving patch tokens are partitioned by their WPR
   importance into *sources* ``S`` (candidates for pruning) and *targets* ``T``; each source
   takes its most similar target (cosine similarity of the block's keys averaged over heads,
   as ToMe) and the ``r_S`` sources with the highest similarity are pruned -- a duplicate of a
   more important token carries nothing the target does not. Pruned, not merged: sizes carry.

Only the paper's abstract and summaries of §3 were at hand while this module was written (not
its full text), so the choices below are ours, and each one the paper may settle differently is
a parameter; docs/methods.md lists them:

- **Budget.** ``r`` tokens per pruning block, as ToMe (an int, or a list with one value per
  block of the model), capped at ``(N - prefix) // 2`` per block exactly as ToMe: at the same
  ``r`` the token counts (and so the counted GMACs, up to the scoring cost) equal ToMe's. The
  default ``r=11`` at every block puts DeiT-S at 0.659 x its GMACs (4.599 -> 3.033), next to
  the paper's headline budget (DeiT-S FLOPs -34.7 %, i.e. 0.653 x). ``layers`` restricts
  pruning to some blocks (``None``: every block; a list entry of ``r`` at a block outside
  ``layers`` is ignored).
- **I/S split.** ``r_I = floor(i_share * r + 1/2)`` tokens go in the I-stage, ``r_S = r - r_I``
  in the S-stage (after the cap); ``i_share=0.5`` by default, ``1`` is importance-only pruning,
  ``0`` similarity-only. The I-stage runs first; the S-stage partitions by the same scores.
- **Partition** (``partition``). ``"sequential"`` (default): the surviving patches sorted by
  importance, the more important ``ceil(M/2)`` are targets, the less important ``floor(M/2)``
  sources. ``"alternate"``: in importance order, ranks 0, 2, 4, ... are targets and 1, 3, 5, ...
  sources (every source has a target just above it in importance).
- **Heads** (``heads``). ``"eir"`` (default): WPR on every head's graph, then the scores are
  aggregated by their root mean square over heads, which weighs a head's concentrated (large)
  scores more than a plain mean -- our reading of the paper's "Emphasizing Informative Region"
  aggregation. ``"mean"``: one WPR on the head-averaged attention. The paper's Variance-based
  Head Filter (dropping heads whose score variance is out of a tuned range) is not implemented:
  its thresholds are tuned per model.
- **Iterations.** A fixed ``iters=30`` (no convergence test, so no host synchronisation and
  every image costs the same); the scores are computed in fp32.
- **Ties** (equal importance or similarity): the lower position first (stable sorts), so the
  method is deterministic. The kept patches stay in their original order after the prefix
  (nothing downstream depends on positions: no later step pairs tokens by position).

Cost per pruning block: the unfused attention (the full matrix is needed), ``iters * h * N^2``
MACs for the WPR (``iters * N^2`` with ``heads="mean"``), and the ``|S| x |T| x d`` similarity
matmul; the counter sees all of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, TokenState, max_merge
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench_plugins.ppt import check_layers

#: how the per-head importance scores are combined (module docstring, "Heads")
HEAD_MODES = ("eir", "mean")
#: how the surviving tokens are split into sources and targets (module docstring, "Partition")
PARTITIONS = ("sequential", "alternate")


@dataclass(frozen=True)
class ZeroTPruneParams:
    """``r`` tokens pruned per pruning block (an int, or one value per block), ``i_share`` of
    them by importance and the rest by similarity; ``iters`` WPR iterations; ``heads`` and
    ``partition`` as in the module docstring; ``layers`` the pruning blocks (``None``: all)."""

    r: Union[int, list[int]] = 11
    i_share: float = 0.5
    iters: int = 30
    heads: str = "eir"
    partition: str = "sequential"
    layers: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"zero-tprune.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")
        if not 0.0 <= self.i_share <= 1.0:
            raise ParamError(f"zero-tprune.i_share={self.i_share} is out of range; it must be in [0, 1]")
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 1:
            raise ParamError(f"zero-tprune.iters={self.iters!r} is out of range; it must be an integer >= 1")
        if self.heads not in HEAD_MODES:
            raise ParamError(f"zero-tprune.heads={self.heads!r}; valid: {', '.join(HEAD_MODES)}")
        if self.partition not in PARTITIONS:
            raise ParamError(f"zero-tprune.partition={self.partition!r}; valid: {', '.join(PARTITIONS)}")
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            raise ParamError(f"zero-tprune.layers={list(self.layers)}: block indices are >= 0")


def weighted_page_rank(attn: torch.Tensor, iters: int) -> torch.Tensor:
    """The WPR scores of attention graphs ``attn [..., N, N]`` (row ``i``: query ``i``'s
    attention over the keys): ``iters`` steps of ``s <- A^T s`` from ``s = 1/N``; ``[..., N]``,
    each a distribution over the tokens."""
    n = attn.shape[-1]
    s = attn.new_full((*attn.shape[:-2], 1, n), 1.0 / n)
    for _ in range(iters):
        s = s @ attn  # s_new[j] = sum_i s[i] A[i, j]
    return s.squeeze(-2)


def token_importance(attn: torch.Tensor, iters: int, heads: str = "eir") -> torch.Tensor:
    """Importance ``[B, N]`` of every token from one block's attention ``[B, h, N, N]``: WPR per
    head aggregated by the root mean square over heads (``"eir"``), or WPR on the head mean
    (``"mean"``). Computed in fp32."""
    attn = attn.float()
    if heads == "mean":
        return weighted_page_rank(attn.mean(dim=1), iters)
    if heads == "eir":
        return weighted_page_rank(attn, iters).square().mean(dim=1).sqrt()
    raise ValueError(f"heads={heads!r}; valid: {', '.join(HEAD_MODES)}")


def split_budget(r: int, i_share: float) -> tuple[int, int]:
    """``(r_I, r_S)``: the tokens the I-stage and the S-stage prune out of ``r``."""
    r_i = min(r, math.floor(i_share * r + 0.5))
    return r_i, r - r_i


def partition_by_importance(order: torch.Tensor, partition: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Split token indices ``order [B, M]`` (most important first) into
    ``(sources [B, floor(M/2)], targets [B, ceil(M/2)])``."""
    m = order.shape[1]
    if partition == "sequential":
        return order[:, (m + 1) // 2:], order[:, : (m + 1) // 2]
    if partition == "alternate":
        return order[:, 1::2], order[:, 0::2]
    raise ValueError(f"partition={partition!r}; valid: {', '.join(PARTITIONS)}")


def most_similar_sources(keys: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor,
                         r: int) -> torch.Tensor:
    """The ``r`` of ``sources [B, S]`` (token indices) whose most similar target (cosine
    similarity of ``keys [B, N, d]``) is the most similar, highest first ``[B, r]``."""
    k = F.normalize(keys.float(), dim=-1)
    d = k.shape[-1]
    k_src = k.gather(1, sources[..., None].expand(-1, -1, d))
    k_dst = k.gather(1, targets[..., None].expand(-1, -1, d))
    best = (k_src @ k_dst.transpose(-1, -2)).max(dim=-1).values  # [B, S]
    rank = best.argsort(dim=-1, descending=True, stable=True)[:, :r]
    return sources.gather(1, rank)


def kept_patches(importance: torch.Tensor, keys: torch.Tensor, r_i: int, r_s: int,
                 partition: str = "sequential") -> torch.Tensor:
    """The patch tokens a pruning block keeps, ``[B, N_p - r_i - r_s]`` in ascending order.

    ``importance [B, N_p]`` and ``keys [B, N_p, d]`` of the patch tokens: the I-stage drops the
    ``r_i`` least important, the S-stage the ``r_s`` sources most similar to a target
    (``r_s <= floor((N_p - r_i) / 2)``).
    """
    n = importance.shape[1]
    order = importance.argsort(dim=-1, descending=True, stable=True)
    survivors = order[:, : n - r_i]  # I-stage: most important first
    if r_s > 0:
        sources, targets = partition_by_importance(survivors, partition)
        if r_s > sources.shape[1]:
            raise ValueError(f"the S-stage cannot prune {r_s} of {sources.shape[1]} sources")
        dropped = most_similar_sources(keys, sources, targets, r_s)
        survivors = _without(survivors, dropped, n)
    return survivors.sort(dim=-1).values


def _without(index: torch.Tensor, dropped: torch.Tensor, n: int) -> torch.Tensor:
    """The entries of ``index [B, M]`` (token indices below ``n``) not in ``dropped [B, k]`` (a
    subset of them), ``[B, M - k]`` in their order; no host synchronisation (a stable sort moves
    the dropped ones last)."""
    gone = torch.zeros(index.shape[0], n, dtype=torch.int32, device=index.device)
    gone = gone.scatter_(1, dropped, 1).gather(1, index)
    moved = gone.argsort(dim=-1, stable=True)[:, : index.shape[1] - dropped.shape[1]]
    return index.gather(1, moved)


class ZeroTPruneReducer:
    """One pruning block: the I-stage then the S-stage, ``r`` patch tokens in all."""

    needs: frozenset[str] = frozenset({"attn", "keys"})

    def __init__(self, r: int, i_share: float, iters: int, heads: str, partition: str) -> None:
        self.r = r
        self.i_share = i_share
        self.iters = iters
        self.heads = heads
        self.partition = partition

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        r = min(self.r, max_merge(x.shape[1], prefix))
        if r <= 0:
            return x
        r_i, r_s = split_budget(r, self.i_share)
        with torch.no_grad():  # the choice of tokens; gradients flow through the kept ones
            importance = token_importance(info.attn, self.iters, self.heads)[:, prefix:]
            patches = kept_patches(importance, info.keys[:, prefix:], r_i, r_s, self.partition)
        head = torch.arange(prefix, device=x.device).expand(x.shape[0], prefix)
        return state.keep(x, torch.cat([head, patches + prefix], dim=1))


def schedule(r: Union[int, list[int]], layers: Optional[tuple[int, ...]], depth: int) -> list[int]:
    """Tokens pruned in each of ``depth`` blocks (0 outside ``layers``)."""
    if isinstance(r, int):
        values = [r] * depth
    elif len(r) != depth:
        raise ParamError(f"zero-tprune.r has {len(r)} entries; the model has {depth} blocks")
    else:
        values = list(r)
    if layers is None:
        return values
    check_layers("zero-tprune", layers, depth)
    return [v if i in layers else 0 for i, v in enumerate(values)]


def build(params: ZeroTPruneParams, info: ModelInfo) -> Reduction:
    reducers = [ZeroTPruneReducer(r, params.i_share, params.iters, params.heads, params.partition)
                if r > 0 else None for r in schedule(params.r, params.layers, info.depth)]
    return Reduction(reducers, prop_attn=True)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="zero-tprune",
        kind="pruning",
        params=ZeroTPruneParams,
        build=build,
        families=("vit",),
        needs_attention_probs=True,
        # r tokens pruned per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="Zero-TPrune: prune r tokens per block by Weighted PageRank importance on the "
                    "attention graph, then by key similarity to more important tokens (training-free)",
    ))
