"""The ``diffrate`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.diffrate`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.errors import ParamError, UnsupportedError
from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, TrainStage, cost, descending_order, reduction_context,
    vit_block_costs,
)
from vitbench_plugins.diffrate import DiffRateParams, DiffRateSearchParams


MASK_EPS = 1e-6
_MASK = "diffrate_mask"  # training: [B, N] straight-through keep mask
_KEPT = "diffrate_kept"  # training: {block: (K_p, K_m)} straight-through counts (0-dim tensors)


def _round_half_up(value: float) -> int:
    return int(math.floor(value + 0.5))


def default_schedule(num_patches: int, depth: int, keep: float,
                     merge_share: float) -> tuple[list[int], list[int]]:
    """``(prune_kept, merge_kept)`` of the default schedule (docs/methods.md, "DiffRate"): ``round(keep *
    N_p)`` patches (at least 1) left after the last block, the same number removed in every
    block, ``merge_share`` of each block's removals merged, the rest pruned."""
    last = max(1, _round_half_up(keep * num_patches))
    after = [num_patches - _round_half_up((i + 1) * (num_patches - last) / depth) for i in range(depth)]
    prune_kept, merge_kept, before = [], [], num_patches
    for n in after:
        merged = _round_half_up(merge_share * (before - n))
        prune_kept.append(n + merged)
        merge_kept.append(n)
        before = n
    return prune_kept, merge_kept


def resolve_schedule(params: DiffRateParams, info: ModelInfo) -> tuple[list[int], list[int]]:
    """The kept counts for the model ``info`` describes; a ParamError if lists do not fit it."""
    depth, n_p = info.depth, info.num_patches
    if params.prune_kept is None and params.merge_kept is None:
        return default_schedule(n_p, depth, params.keep, params.merge_share)
    for name in ("prune_kept", "merge_kept"):
        counts = getattr(params, name)
        if counts is not None and len(counts) != depth:
            raise ParamError(f"diffrate.{name} has {len(counts)} entries; the model has {depth} blocks "
                             f"(one count per block)")
        if counts is not None and counts[0] > n_p:
            raise ParamError(f"diffrate.{name}[0]={counts[0]} is out of range; the model has {n_p} patch "
                             f"tokens, so counts must be <= {n_p}")
    if params.merge_kept is None:  # pruning only
        return list(params.prune_kept), list(params.prune_kept)  # type: ignore[arg-type]
    if params.prune_kept is None:  # merging only: each block prunes nothing
        merge_kept = list(params.merge_kept)
        return [n_p] + merge_kept[:-1], merge_kept
    return list(params.prune_kept), list(params.merge_kept)


def class_attention(info: AttnInfo, prefix: int) -> torch.Tensor:
    """Importance ``[B, N - prefix]`` of the patch tokens: the class token's attention to each,
    averaged over heads (the paper's ``A_c``)."""
    if info.cls_attn is None:
        raise ValueError("diffrate needs the block's class-attention row (needs 'cls_attn')")
    return info.cls_attn[:, :, prefix:].mean(dim=1)


def importance_ranks(importance: torch.Tensor) -> torch.Tensor:
    """Each token's place ``[B, n]`` when sorted by ``importance``, most important ``0``; equal
    importances: the lower position first."""
    order = descending_order(importance)
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)


def merge_partners(keys: torch.Tensor, important: torch.Tensor) -> torch.Tensor:
    """For tokens with keys ``[B, n, d]``: the index ``[B, n]`` of each token's most similar
    ``important [B, n]`` token (cosine similarity; an important token is its own partner).
    Runs without gradients (the choice is a constant; gradients flow through the merge).
    Every image must have the same number of important tokens, at least one."""
    with torch.no_grad():
        b, n, _ = keys.shape
        k = int(important[0].sum())
        unit = F.normalize(keys.float(), dim=-1)
        order = important.to(torch.int8).argsort(dim=1, descending=True, stable=True)  # important first
        dst, src = order[:, :k], order[:, k:]
        d = unit.shape[-1]
        unit_src = unit.gather(1, src[..., None].expand(-1, -1, d))
        unit_dst = unit.gather(1, dst[..., None].expand(-1, -1, d))
        sim = unit_src @ unit_dst.transpose(1, 2)  # [B, n - k, k]: the merge's (K_p - K_m) K_m d MACs
        partner = torch.arange(n, device=keys.device).expand(b, n).clone()
        return partner.scatter_(1, src, dst.gather(1, sim.argmax(dim=-1)))


def prune_then_merge(x: torch.Tensor, state: TokenState, keys: torch.Tensor, importance: torch.Tensor,
                     prune_kept: int, merge_kept: int) -> torch.Tensor:
    """One block's compression at inference: keep the ``prune_kept`` most important patch
    tokens, then merge all but the ``merge_kept`` most important of them into their most similar
    kept token (size-weighted). ``keys [B, N, d]``, ``importance [B, N - prefix]``; the counts
    are capped to the tokens present. Output: the prefix, then the kept tokens in their order."""
    p = state.prefix
    b, n = importance.shape
    kp = min(prune_kept, n)
    km = min(merge_kept, kp)
    if km >= n:
        return x
    rank = importance_ranks(importance)
    kept = (rank < kp).to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :kp]  # in order
    if kp < n:
        head = torch.arange(p, device=x.device).expand(b, p)
        x = state.keep(x, torch.cat([head, kept + p], dim=1))
    if km == kp:
        return x
    important = rank.gather(1, kept) < km
    kept_keys = keys[:, p:].gather(1, kept[..., None].expand(-1, -1, keys.shape[-1]))
    partner = merge_partners(kept_keys, important)  # index among the kept tokens
    cluster_of = important.long().cumsum(dim=1) - 1  # the important tokens' clusters, in order
    return state.cluster(x, cluster_of.gather(1, partner), km)


class DiffRateReducer(Reducer):
    """One block of ``diffrate``: prune to ``prune_kept``, merge to ``merge_kept`` patch tokens."""

    needs = frozenset({"keys", "cls_attn"})

    def __init__(self, prune_kept: int, merge_kept: int) -> None:
        self.prune_kept = prune_kept
        self.merge_kept = merge_kept

    def __repr__(self) -> str:
        return f"DiffRateReducer(prune_kept={self.prune_kept}, merge_kept={self.merge_kept})"

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        importance = class_attention(info, state.prefix)
        return prune_then_merge(x, state, info.keys, importance, self.prune_kept, self.merge_kept)


def _check_class_token(method: str, info: ModelInfo) -> None:
    if info.num_prefix_tokens == 0:
        raise UnsupportedError(f"{method} ranks tokens by the class token's attention; this model has no "
                               f"class token (global_pool={info.global_pool!r}, no prefix tokens)")


def build(params: DiffRateParams, info: ModelInfo) -> Reduction:
    _check_class_token("diffrate", info)
    prune_kept, merge_kept = resolve_schedule(params, info)
    before = [info.num_patches] + merge_kept[:-1]
    reducers = [DiffRateReducer(p, m) if m < n else None for p, m, n in zip(prune_kept, merge_kept, before)]
    return Reduction(reducers, prop_attn=True)


_CEIL_TOLERANCE = 1e-3
#: the initial probability of "remove nothing", so the search starts from the unpatched model
INIT_KEEP_PROBABILITY = 0.99


def initial_logits(candidates: int) -> torch.Tensor:
    """Logits ``[K]`` giving the candidate rate 0 the probability :data:`INIT_KEEP_PROBABILITY`
    and the other ``K - 1`` equal shares of the rest."""
    logits = torch.zeros(candidates)
    if candidates > 1:
        p = INIT_KEEP_PROBABILITY
        logits[0] = math.log(p * (candidates - 1) / (1.0 - p))
    return logits


def candidate_rates(candidates: int, like: torch.Tensor) -> torch.Tensor:
    """The discrete rates ``C_k = k / K``, ``k = 0 .. K-1``: the fraction of a block's tokens
    a candidate removes (at most ``1 - 1/K``, so a token always stays)."""
    return torch.arange(candidates, device=like.device, dtype=like.dtype) / candidates


def expected_rate(logits: torch.Tensor) -> torch.Tensor:
    """``alpha = sum_k rho_k C_k`` (0-dim), ``rho = softmax(logits)``: the re-parameterised rate."""
    return (logits.softmax(dim=0) * candidate_rates(logits.shape[0], logits)).sum()


def ste_ceil(value: torch.Tensor) -> torch.Tensor:
    """``ceil(value)`` forward, the identity's gradient backward; a value less than
    :data:`_CEIL_TOLERANCE` above a whole number counts as that number (float rounding)."""
    return value + (torch.ceil(value.detach() - _CEIL_TOLERANCE) - value.detach())


def survival(logits: torch.Tensor, tokens: int) -> torch.Tensor:
    """``P [tokens]``: the probability that the kept count exceeds ``j`` when a block with
    ``tokens`` tokens keeps ``ceil(tokens * (1 - C_k))`` with probability ``rho_k``: the soft
    mask of the token at sorted position ``j`` (the paper's attention mask)."""
    rho = logits.softmax(dim=0)
    kept = torch.ceil(tokens * (1.0 - candidate_rates(logits.shape[0], logits)) - _CEIL_TOLERANCE).long()  # [K]
    j = torch.arange(tokens, device=logits.device)
    return ((kept[None, :] > j[:, None]).to(rho.dtype) * rho[None, :]).sum(dim=1)


def _as_int(count: torch.Tensor) -> int:
    return int(round(float(count.detach())))


def _straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    return hard.to(soft.dtype) + (soft - soft.detach())


class DiffRateSearchReducer(nn.Module, Reducer):
    """One block of ``diffrate-search``: learnable distributions over the candidate rates
    ``C_k = k / K`` (``K = N_p``) of pruning (``prune_logits``: the fraction of the block's
    incoming patch tokens pruned) and of merging (``merge_logits``: the fraction of the tokens
    left after pruning that merge)."""

    needs = frozenset({"keys", "cls_attn"})

    def __init__(self, index: int, num_patches: int) -> None:
        super().__init__()
        self.index = index
        self.num_patches = num_patches
        self.prune_logits = nn.Parameter(initial_logits(num_patches))
        self.merge_logits = nn.Parameter(initial_logits(num_patches))
        self.train(False)  # inference until model.train() (methods are applied to eval models)

    def extra_repr(self) -> str:
        return f"index={self.index}, candidates={self.num_patches}"

    def counts(self, incoming: Union[torch.Tensor, float]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K_p, K_m)`` for ``incoming`` patch tokens: ``K_p = ceil(incoming * (1 - alpha_p))``,
        ``K_m = ceil(K_p * (1 - alpha_m))``, straight-through (0-dim tensors of whole numbers)."""
        kp = ste_ceil(incoming * (1.0 - expected_rate(self.prune_logits)))
        km = ste_ceil(kp * (1.0 - expected_rate(self.merge_logits)))
        return kp, km

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if info.keys is None or info.cls_attn is None:
            raise ValueError("diffrate-search needs the block's keys and class-attention row")
        if self.training:
            return self._mask(x, state, info)
        kp, km = self.counts(float(x.shape[1] - state.prefix))
        importance = class_attention(info, state.prefix)
        return prune_then_merge(x, state, info.keys, importance, _as_int(kp), _as_int(km))

    def _mask(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        """Training: the tokens stay; the keep mask, sizes and key bias change (docs/methods.md, "DiffRate")."""
        b, n, _ = x.shape
        p = state.prefix
        mask = state.private.get(_MASK)
        if mask is None:
            mask = torch.ones(b, n, device=x.device, dtype=self.prune_logits.dtype)
        current = mask.detach()[:, p:] > 0.5  # [B, n_p]
        kept = state.private.setdefault(_KEPT, {})
        previous = [kept[i][1] for i in sorted(kept) if i < self.index]
        incoming: Union[torch.Tensor, float] = previous[-1] if previous else float(n - p)
        n_in = _as_int(torch.as_tensor(incoming))
        if bool((current.sum(dim=1) != n_in).any()):
            raise ValueError(f"diffrate-search block {self.index}: the images carry other token counts "
                             f"than the search's ({n_in}); every image keeps the same count")
        kp, km = self.counts(incoming)
        kept[self.index] = (kp, km)
        kp_i, km_i = _as_int(kp), _as_int(km)
        importance = class_attention(info, p).masked_fill(~current, float("-inf"))
        rank = importance_ranks(importance).clamp_max(n_in - 1)  # masked tokens: rank >= n_in, mask 0
        keep_soft = survival(self.prune_logits, n_in)[rank]  # [B, n_p]
        merge_soft = 1.0 - survival(self.merge_logits, kp_i)[rank.clamp_max(kp_i - 1)]
        keep = _straight_through(current & (rank < kp_i), keep_soft)
        weight = keep * _straight_through(current & (rank >= km_i), merge_soft)  # forward: [km <= rank < kp]
        if km_i < kp_i:
            partner = merge_partners(info.keys[:, p:], current & (rank < km_i))
            x = _merge_into(x, state, weight, partner)
        patch_mask = mask[:, p:] * keep * (1.0 - weight)
        mask = torch.cat([mask[:, :p], patch_mask], dim=1)
        state.private[_MASK] = mask
        state.key_bias = torch.log(mask + MASK_EPS)[:, None, None, :]
        return x


def _merge_into(x: torch.Tensor, state: TokenState, weight: torch.Tensor, partner: torch.Tensor) -> torch.Tensor:
    """Training's merge: each patch token, times ``weight [B, n_p]`` (straight-through 0/1), is
    added size-weighted into its ``partner [B, n_p]`` (an index among the patch tokens); sizes
    add up; a source keeps its value and size (its mask removes it); sources follow."""
    p = state.prefix
    size = state.sizes(x)
    zeros = torch.zeros(x.shape[0], p, device=x.device, dtype=weight.dtype)
    w = torch.cat([zeros, weight], dim=1)[..., None].to(x.dtype)  # [B, N, 1]
    head = torch.arange(p, device=x.device).expand(x.shape[0], p)
    dst = torch.cat([head, partner + p], dim=1)[..., None]  # [B, N, 1]
    moved = w * size
    new_size = size + torch.zeros_like(size).scatter_add(1, dst, moved)
    added = torch.zeros_like(x).scatter_add(1, dst.expand_as(x), x * moved)
    if state.source is not None:
        src = state.source
        state.source = src + torch.zeros_like(src).scatter_add(1, dst.expand_as(src), src * w.to(src.dtype))
    state.size = new_size
    return (x * size + added) / new_size


@dataclass(frozen=True)
class SearchCost(cost.CostModel):
    """The MACs of one image's inference forward of a ``diffrate``-reduced ViT as a function of
    the kept counts, term by term as ``vitbench.measure.count_gmacs`` counts them (the search's
    penalty, ``gmacs_fraction``).

    With ``n`` the tokens block ``l`` receives (prefix included; ``prefix + N_p`` for block 0)
    and ``K_p``, ``K_m`` its patch counts: ``linear[l] * n + quadratic[l] * n^2 + cls_row[l] *
    n + head_dim[l] * (K_p - K_m) * K_m + mlp[l] * (prefix + K_m)``; ``cls_row`` is the class
    token's attention row computed next to the fused kernel (``heads * head_dim``; 0 when the
    block runs unfused, whose full matrix is already counted), the ``head_dim`` term the
    merge's similarities. ``fixed``: the patch embedding and head(s). Softmax, norms, sorting
    and element-wise ops are not counted, as by the counter."""

    num_patches: int
    prefix: int
    fixed: float
    linear: tuple[float, ...]
    quadratic: tuple[float, ...]
    cls_row: tuple[float, ...]
    head_dim: tuple[float, ...]
    mlp: tuple[float, ...]

    @property
    def full(self) -> float:
        """MACs of the unreduced model (no class-attention row, no merge)."""
        n = float(self.prefix + self.num_patches)
        return self.fixed + sum(a * n + b * n * n + c * n for a, b, c in zip(self.linear, self.quadratic, self.mlp))

    def terms(self, kept: Sequence[tuple[Union[torch.Tensor, float], Union[torch.Tensor, float]]]
              ) -> Iterator[Union[torch.Tensor, float]]:
        """Each block's terms for ``kept[l] = (K_p, K_m)`` (tensors or numbers; differentiable)."""
        n: Union[torch.Tensor, float] = float(self.prefix + self.num_patches)
        for l, (kp, km) in enumerate(kept):
            yield self.linear[l] * n
            yield self.quadratic[l] * n * n
            yield self.cls_row[l] * n
            yield self.head_dim[l] * (kp - km) * km
            yield self.mlp[l] * (self.prefix + km)
            n = self.prefix + km


def search_cost(model: nn.Module, info: ModelInfo, image: Optional[torch.Tensor] = None) -> SearchCost:
    """The :class:`SearchCost` of ``model`` (a timm ViT, unreduced or reduced with
    ``diffrate-search``): the blocks' terms read off their modules
    (:func:`vitbench.kit.vit_block_costs`), the fixed part counted on ``image`` (default: a zero
    image of the model's input size), less the terms of the counts that forward kept."""
    blocks = vit_block_costs(model, info.embed_dim)
    fused = [bool(getattr(getattr(blk, "block", blk).attn, "fused_attn", False)) for blk in model.blocks]
    terms = SearchCost(num_patches=info.num_patches, prefix=info.num_prefix_tokens, fixed=0.0,
                       linear=blocks.linear, quadratic=blocks.quadratic,
                       cls_row=tuple(q / 2 if f else 0.0 for q, f in zip(blocks.quadratic, fused)),  # heads * head_dim
                       head_dim=tuple(float(d) for d in blocks.head_dim), mlp=blocks.mlp)

    def counted_terms() -> float:
        if not any(isinstance(m, DiffRateSearchReducer) for m in model.modules()):
            return terms.full  # unreduced: no class-attention row, no merge
        return float(terms.macs(list(zip(*searched_kept(model)))))

    if image is None:
        image = cost.probe_image(model, tuple(model.patch_embed.img_size))
    return replace(terms, fixed=cost.counted_fixed(model, image, counted_terms))


def gmacs_penalty_of(params: DiffRateSearchParams, info: ModelInfo):  # type: ignore[no-untyped-def]
    """The train stage's ``extra_loss``: ``lambda * (gmacs_ratio - gmacs_fraction)^2`` of the last
    training forward, ``gmacs_ratio`` the counted cost (:class:`SearchCost`) of the forward's
    straight-through counts over the unreduced model's; logged in ``ctx.extras`` as
    ``diffrate_gmacs_ratio`` (and the counts as ``diffrate_kept``). ``None`` after an inference
    forward."""
    costs: dict[int, SearchCost] = {}

    def penalty(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        ctx = reduction_context(model)
        kept = ctx.state.private.get(_KEPT) if ctx is not None and ctx.state is not None else None
        if not kept:
            return None
        if id(model) not in costs:
            costs[id(model)] = search_cost(model, info)
        per_block = [kept[i] for i in range(info.depth)]
        ratio = costs[id(model)].ratio(per_block)
        ctx.extras["diffrate_gmacs_ratio"] = ratio.detach()  # type: ignore[union-attr]
        ctx.extras["diffrate_kept"] = [(_as_int(kp), _as_int(km)) for kp, km in per_block]
        return params.lambda_flops * (ratio - params.gmacs_fraction) ** 2

    return penalty


def searched_kept(model: nn.Module) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(prune_kept, merge_kept)``: the counts a ``diffrate-search`` model runs at inference,
    as ``diffrate``'s parameters (``vitbench.apply(model, "diffrate", prune_kept=...,
    merge_kept=...)`` then gives the same outputs)."""
    reducers = sorted((m for m in model.modules() if isinstance(m, DiffRateSearchReducer)), key=lambda m: m.index)
    if not reducers:
        raise ValueError("searched_kept: the model is not reduced with diffrate-search")
    prune_kept, merge_kept = [], []
    incoming: float = float(reducers[0].num_patches)
    with torch.no_grad():
        for reducer in reducers:
            kp, km = reducer.counts(incoming)
            prune_kept.append(_as_int(kp))
            merge_kept.append(_as_int(km))
            incoming = float(merge_kept[-1])
    return tuple(prune_kept), tuple(merge_kept)


def build_search(params: DiffRateSearchParams, info: ModelInfo) -> Reduction:
    _check_class_token("diffrate-search", info)
    reducers = [DiffRateSearchReducer(i, info.num_patches) for i in range(info.depth)]
    stage = TrainStage(
        name="rates",
        epochs=params.epochs,
        optimizer=params.optimizer,
        lr=params.lr,
        weight_decay=0.0,
        schedule="cosine",
        label_smoothing=params.label_smoothing,
        batch_size=params.batch_size,
        trainable=("prune_logits", "merge_logits"),
        extra_loss=gmacs_penalty_of(params, info),
    )
    return Reduction(reducers, prop_attn=True, train=(stage,))
