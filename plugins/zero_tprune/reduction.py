"""The ``zero_tprune`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.zero_tprune`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F

from vitbench.errors import ParamError
from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, check_layers, descending_order, max_merge
from vitbench_plugins.zero_tprune import HEAD_MODES, INITS, PARTITIONS, ZeroTPruneParams


def initial_scores(n: int, init: str = "uniform", device: Optional[torch.device] = None,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The WPR's start ``s_0 [n]``, a distribution: ``"uniform"`` ``1/n`` each; ``"cls"`` token 0
    (the class token) ``sqrt(n)`` times the weight of every other token (the paper's default
    initialisation; its uniform variant is "Zero-TPrune-uni")."""
    if init not in INITS:
        raise ValueError(f"init={init!r}; valid: {', '.join(INITS)}")
    s = torch.ones(n, device=device, dtype=dtype)
    if init == "cls":
        s[0] = math.sqrt(n)
    return s / s.sum()


def weighted_page_rank(attn: torch.Tensor, iters: int, start: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The WPR scores of attention graphs ``attn [..., N, N]`` (row ``i``: query ``i``'s
    attention over the keys): ``iters`` steps of ``s <- A^T s`` (the paper's Algorithm 1) from
    ``start [N]`` (default ``1/N`` each); ``[..., N]``, each a distribution over the tokens."""
    n = attn.shape[-1]
    s = attn.new_full((1, n), 1.0 / n) if start is None else start.to(attn).reshape(1, n)
    s = s.expand(*attn.shape[:-2], 1, n)
    for _ in range(iters):
        s = s @ attn  # s_new[j] = sum_i s[i] A[i, j]
    return s.squeeze(-2)


def token_importance(attn: torch.Tensor, iters: int, heads: str = "eir",
                     init: str = "uniform") -> torch.Tensor:
    """Importance ``[B, N]`` of every token from one block's attention ``[B, h, N, N]``: WPR
    (started as ``init`` says, :func:`initial_scores`) per head aggregated by the root mean
    square over heads (``"eir"``), or WPR on the head mean (``"mean"``). Computed in fp32."""
    attn = attn.float()
    start = initial_scores(attn.shape[-1], init, attn.device, attn.dtype)
    if heads == "mean":
        return weighted_page_rank(attn.mean(dim=1), iters, start)
    if heads == "eir":
        return weighted_page_rank(attn, iters, start).square().mean(dim=1).sqrt()
    raise ValueError(f"heads={heads!r}; valid: {', '.join(HEAD_MODES)}")


def sub_graph(attn: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The attention graph ``attn [B, h, N, N]`` restricted to ``tokens [B, M]`` (indices, in
    the order given), each row renormalised to sum 1 -- the softmax over the kept keys only:
    ``[B, h, M, M]``."""
    b, h, n, _ = attn.shape
    m = tokens.shape[1]
    rows = attn.gather(2, tokens[:, None, :, None].expand(b, h, m, n))
    sub = rows.gather(3, tokens[:, None, None, :].expand(b, h, m, m))
    return sub / sub.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(sub.dtype).tiny)


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
    rank = descending_order(best)[:, :r]
    return sources.gather(1, rank)


def kept_patches(importance: torch.Tensor, keys: torch.Tensor, r_i: int, r_s: int,
                 partition: str = "sequential") -> torch.Tensor:
    """The patch tokens a pruning block keeps, ``[B, N_p - r_i - r_s]`` in ascending order.

    ``importance [B, N_p]`` and ``keys [B, N_p, d]`` of the patch tokens: the I-stage drops the
    ``r_i`` least important, the S-stage the ``r_s`` sources most similar to a target
    (``r_s <= floor((N_p - r_i) / 2)``).
    """
    n = importance.shape[1]
    order = descending_order(importance)
    survivors = order[:, : n - r_i]  # I-stage: most important first
    if r_s > 0:
        sources, targets = partition_by_importance(survivors, partition)
        if r_s > sources.shape[1]:
            raise ValueError(f"the S-stage cannot prune {r_s} of {sources.shape[1]} sources")
        dropped = most_similar_sources(keys, sources, targets, r_s)
        survivors = _without(survivors, dropped, n)
    return survivors.sort(dim=-1).values


def kept_patches_s_first(attn: torch.Tensor, keys: torch.Tensor, prefix: int, r_i: int, r_s: int,
                         iters: int, heads: str = "eir", init: str = "cls",
                         partition: str = "sequential") -> torch.Tensor:
    """The patch tokens a pruning block keeps in the paper's order I' -> S -> I, ``[B, N_p - r_i
    - r_s]`` in ascending order (patch indices, ``0`` = the first token after the prefix).

    ``attn [B, h, N, N]`` and ``keys [B, N, d]`` of all tokens. I'-stage: one WPR step ranks the
    patches (nothing pruned). S-stage: partitioned by that ranking, the ``r_s`` sources most
    similar to a target go. I-stage: WPR (``iters`` steps) on the graph of the tokens left
    (prefix included, rows renormalised, :func:`sub_graph`), and the ``r_i`` least important
    patches go.
    """
    b, n_p = keys.shape[0], keys.shape[1] - prefix
    survivors = torch.arange(n_p, device=keys.device).expand(b, n_p)
    if r_s > 0:
        pre = token_importance(attn, 1, heads, init)[:, prefix:]  # I'-stage: one vote
        order = descending_order(pre)
        sources, targets = partition_by_importance(order, partition)
        if r_s > sources.shape[1]:
            raise ValueError(f"the S-stage cannot prune {r_s} of {sources.shape[1]} sources")
        dropped = most_similar_sources(keys[:, prefix:], sources, targets, r_s)
        survivors = _without(survivors, dropped, n_p)
    if r_i > 0:
        head = torch.arange(prefix, device=keys.device).expand(b, prefix)
        graph = sub_graph(attn.float(), torch.cat([head, survivors + prefix], dim=1))
        importance = token_importance(graph, iters, heads, init)[:, prefix:]
        keep = descending_order(importance)[:, : survivors.shape[1] - r_i]
        survivors = survivors.gather(1, keep)
    return survivors.sort(dim=-1).values


def _without(index: torch.Tensor, dropped: torch.Tensor, n: int) -> torch.Tensor:
    """The entries of ``index [B, M]`` (token indices below ``n``) not in ``dropped [B, k]`` (a
    subset of them), ``[B, M - k]`` in their order; no host synchronisation (a stable sort moves
    the dropped ones last)."""
    gone = torch.zeros(index.shape[0], n, dtype=torch.int32, device=index.device)
    gone = gone.scatter_(1, dropped, 1).gather(1, index)
    moved = gone.argsort(dim=-1, stable=True)[:, : index.shape[1] - dropped.shape[1]]
    return index.gather(1, moved)


class ZeroTPruneReducer(Reducer):
    """One pruning block: the I-stage then the S-stage, ``r`` patch tokens in all."""

    needs: frozenset[str] = frozenset({"attn", "keys"})

    def __init__(self, r: int, i_share: float, iters: int, heads: str, partition: str,
                 init: str = "cls", order: str = "s_first") -> None:
        self.r = r
        self.i_share = i_share
        self.iters = iters
        self.heads = heads
        self.partition = partition
        self.init = init
        self.order = order

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        r = min(self.r, max_merge(x.shape[1], prefix))
        if r <= 0:
            return x
        r_i, r_s = split_budget(r, self.i_share)
        init = self.init if prefix > 0 else "uniform"  # no class token to start from
        with torch.no_grad():  # the choice of tokens; gradients flow through the kept ones
            if self.order == "s_first":
                patches = kept_patches_s_first(info.attn, info.keys, prefix, r_i, r_s, self.iters,
                                               self.heads, init, self.partition)
            else:
                importance = token_importance(info.attn, self.iters, self.heads, init)[:, prefix:]
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
    reducers = [ZeroTPruneReducer(r, params.i_share, params.iters, params.heads, params.partition,
                                  params.init, params.order)
                if r > 0 else None for r in schedule(params.r, params.layers, info.depth)]
    return Reduction(reducers, prop_attn=True)
