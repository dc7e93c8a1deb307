"""The ``ltmp`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.ltmp`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from vitbench.errors import ParamError
from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TileUnmerge, TokenState, TrainStage, cost, first_images, linear_macs,
    reduction_context, straight_through_mask, vit_block_costs,
)
from vitbench_plugins.ltmp import LTMPParams, calibration


MASK_EPS = 1e-6
_MASK = "ltmp_mask"  # training: [B, N] straight-through keep mask
_KEPT = "ltmp_kept"  # training: {block: [B] kept fraction after that block}
_VALID = "ltmp_valid"  # inference: [B, N] bool, False on padding
_COUNTS = "ltmp_counts"  # inference: {block: [B] tokens of each image after that block}


def straight_through(value: torch.Tensor, theta: torch.Tensor, tau: float) -> torch.Tensor:
    """The masker: hard ``value > theta`` forward, gradient of ``sigmoid((value - theta)/tau)``.

    ``value = -inf`` gives exactly 0 with zero gradient (tokens that cannot take part).
    """
    return straight_through_mask(value - theta, tau, noisy=False)


def _front(flags: torch.Tensor,
           group: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``[B, K]`` of the flagged tokens first, ``K`` the most flagged in any image; and
    which of them are flagged. Flagged tokens keep their order, grouped by ``group [B, N]``
    (ascending) when given."""
    key = (~flags).to(torch.long)
    if group is not None:
        key = torch.where(flags, group.to(torch.long), int(group.max()) + 1)
    order = torch.argsort(key, dim=1, stable=True)
    order = order[:, : int(flags.sum(dim=1).max())]
    return order, flags.gather(1, order)


def split_sets(current: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sets A and B ``[B, N]`` of the bipartite split: the current patch tokens, taken in order,
    alternate; the ``j``-th is in A when ``prefix + j`` is even (ToMe's split by position once
    the current tokens stand first; docs/methods.md, "LTMP")."""
    pos = torch.arange(current.shape[1], device=current.device)
    patch = current & (pos >= prefix)
    rank = patch.long().cumsum(dim=1) - 1
    is_a = patch & ((rank + prefix) % 2 == 0)
    return is_a, patch & ~is_a


def bipartite_layout(current: torch.Tensor, prefix: int) -> torch.Tensor:
    """Group ``[B, N]`` of each token in the official layout: 0 the prefix, 1 set A, 2 set B
    (docs/methods.md, "LTMP"). Sorting the tokens that stay by it (stably) gives ToMe's output order:
    prefix, the unmerged A tokens, then the B tokens, each in their current order."""
    is_a, _ = split_sets(current, prefix)
    pos = torch.arange(current.shape[1], device=current.device)
    return torch.where(pos < prefix, 0, torch.where(is_a, 1, 2)).expand_as(current)


def best_partners(metric: torch.Tensor, current: torch.Tensor,
                  prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bipartite matching over the ``current [B, N]`` tokens by ``metric [B, N, d]``.

    Returns ``best [B, N]``, the cosine similarity of each A token to its most similar B token
    (``-inf`` for every other token), and ``dst [B, N]``, that partner's position (a token's own
    position where it is not in A). The split is :func:`split_sets`.
    """
    b, n = current.shape
    with torch.no_grad():
        pos = torch.arange(n, device=current.device)
        is_a, is_b = split_sets(current, prefix)
        best = torch.full((b, n), float("-inf"), device=metric.device, dtype=metric.dtype)
        dst = pos.expand(b, n).clone()
        if not (bool(is_a.any()) and bool(is_b.any())):
            return best, dst
        unit = metric / metric.norm(dim=-1, keepdim=True)
        idx_a, ok_a = _front(is_a)
        idx_b, ok_b = _front(is_b)
        d = unit.shape[-1]
        a = unit.gather(1, idx_a[..., None].expand(-1, -1, d))
        bb = unit.gather(1, idx_b[..., None].expand(-1, -1, d))
        scores = (a @ bb.transpose(-1, -2)).masked_fill(~ok_b[:, None, :], float("-inf"))
        top, j = scores.max(dim=-1)
        top = top.masked_fill(~ok_a, float("-inf"))
        best.scatter_(1, idx_a, top)
        dst.scatter_(1, idx_a, torch.where(ok_a, idx_b.gather(1, j), idx_a))
    return best, dst


def received_attention(attn: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Importance ``[B, N]``: attention each key receives, averaged over heads and over the
    ``queries [B, N]`` that are current (masked and padded queries do not count)."""
    with torch.no_grad():
        per_key = attn.mean(dim=1)  # [B, Nq, Nk]
        w = queries.to(per_key.dtype)
        return (per_key * w[:, :, None]).sum(dim=1) / w.sum(dim=1, keepdim=True).clamp_min(1.0)


def group_importance(importance: torch.Tensor, dst: torch.Tensor, merged: torch.Tensor) -> torch.Tensor:
    """A merge destination takes the max importance over its group (itself and its sources)."""
    sources = importance.masked_fill(~merged, float("-inf"))
    return importance.scatter_reduce(1, dst, sources, reduce="amax", include_self=True)


def _protected(candidates: torch.Tensor, importance: torch.Tensor, prefix: int) -> torch.Tensor:
    """Tokens that are never pruned: the prefix; without prefix, each image's most important
    candidate (so no image loses every token)."""
    b, n = candidates.shape
    keep = (torch.arange(n, device=candidates.device) < prefix).expand(b, n)
    if prefix > 0:
        return keep
    top = importance.masked_fill(~candidates, float("-inf")).argmax(dim=1, keepdim=True)
    return keep | torch.zeros_like(candidates).scatter(1, top, True)


def merge_into_partners(x: torch.Tensor, state: TokenState, weight: torch.Tensor,
                        dst: torch.Tensor) -> torch.Tensor:
    """Add each token, times ``weight [B, N]`` (0 or 1, straight-through in training), into
    its partner ``dst`` size-weighted; sizes add up. A source keeps its own value and size
    (training masks it, inference removes it). Padded tokens (size 0) get value 0."""
    size = state.sizes(x)
    w = weight[..., None].to(x.dtype) * size
    index = dst[..., None]
    new_size = size + torch.zeros_like(size).scatter_add(1, index, w)
    added = torch.zeros_like(x).scatter_add(1, index.expand_as(x), x * w)
    if state.source is not None:
        src = state.source
        state.source = src + torch.zeros_like(src).scatter_add(
            1, index.expand_as(src), src * weight[..., None].to(src.dtype))
    state.size = new_size
    return (x * size + added) / new_size.clamp_min(1e-12)


def _compact(x: torch.Tensor, state: TokenState, keep: torch.Tensor, pruned: torch.Tensor,
             group: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Remove the tokens not in ``keep [B, N]``, laying out the rest grouped by ``group`` (see
    :func:`_front`); pad each image to the batch's largest count."""
    order, valid = _front(keep, group)
    if state.source is not None and state.fill is not None:
        covers = (state.source > 0).to(x.dtype) * pruned[..., None].to(x.dtype)
        values = torch.einsum("btp,btc->bpc", covers, x.detach())
        state.fill = torch.where(covers.sum(dim=1)[..., None] > 0, values, state.fill)
        state.source = state.source.gather(1, order[..., None].expand(-1, -1, state.source.shape[-1]))
        state.source = state.source * valid[..., None].to(state.source.dtype)
    size = state.sizes(x).gather(1, order[..., None]) * valid[..., None].to(x.dtype)
    x = x.gather(1, order[..., None].expand(-1, -1, x.shape[-1])).masked_fill(~valid[..., None], 0.0)
    state.size = size
    state.private[_VALID] = valid
    if bool(valid.all()):
        state.key_bias = None
    else:
        bias = torch.zeros(valid.shape, device=x.device, dtype=x.dtype).masked_fill(~valid, float("-inf"))
        state.key_bias = bias[:, None, None, :]
    return x


class LTMPReducer(nn.Module, Reducer):
    """One block's learned merge and prune thresholds (docs/methods.md, "LTMP")."""

    needs = frozenset({"keys", "attn"})

    def __init__(self, index: int, tau: float, merge_init: float = 0.9, prune_init: float = 0.0,
                 order: str = "bipartite") -> None:
        super().__init__()
        self.index = index
        self.tau = tau
        self.order = order
        self.theta_m = nn.Parameter(torch.tensor(float(merge_init)))
        self.theta_p = nn.Parameter(torch.tensor(float(prune_init)))
        # Inference until ``model.train()``: methods are applied to eval models, and a new
        # nn.Module would otherwise start in training mode inside an eval model.
        self.train(False)

    def extra_repr(self) -> str:
        return f"index={self.index}, tau={self.tau}, order={self.order}"

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if info.keys is None or info.attn is None:
            raise ValueError("ltmp needs the block's keys and attention probabilities")
        if self.training:
            return self._mask(x, state, info)
        return self._remove(x, state, info)

    def _mask(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        """Training: the tokens stay; the keep mask and the key bias change."""
        b, n, _ = x.shape
        mask = state.private.get(_MASK)
        if mask is None:
            mask = torch.ones(b, n, device=x.device, dtype=self.theta_m.dtype)
        current = mask.detach() > 0.5
        best, dst = best_partners(info.keys, current, state.prefix)
        merge = straight_through(best, self.theta_m, self.tau)  # 0 (no grad) outside A
        merged = merge.detach() > 0.5
        x = merge_into_partners(x, state, merge, dst)
        importance = group_importance(received_attention(info.attn, current), dst, merged)
        alive = current & ~merged
        prune = straight_through(importance, self.theta_p, self.tau)
        prune = torch.where(_protected(alive, importance, state.prefix), torch.ones_like(prune), prune)
        mask = mask * (1.0 - merge) * prune
        if self.order == "bipartite":
            # the tokens stay, but in inference's layout: the ones left first, as
            # [prefix, A, B], the masked ones after them (docs/methods.md, "LTMP", "Layout in training")
            group = bipartite_layout(current, state.prefix)
            left = mask.detach() > 0.5
            perm = torch.argsort(torch.where(left, group, 3), dim=1, stable=True)
            x = state.keep(x, perm)
            mask = mask.gather(1, perm)
        state.private[_MASK] = mask
        state.private.setdefault(_KEPT, {})[self.index] = mask.mean(dim=1)
        state.key_bias = torch.log(mask + MASK_EPS)[:, None, None, :]
        return x

    def _remove(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        """Inference: merged and pruned tokens leave; the batch is re-padded."""
        b, n, _ = x.shape
        current = state.private.get(_VALID)
        if current is None:
            current = torch.ones(b, n, device=x.device, dtype=torch.bool)
        best, dst = best_partners(info.keys, current, state.prefix)
        merged = best > self.theta_m
        importance = group_importance(received_attention(info.attn, current), dst, merged)
        alive = current & ~merged
        keep = alive & ((importance > self.theta_p) | _protected(alive, importance, state.prefix))
        state.private.setdefault(_COUNTS, {})[self.index] = keep.sum(dim=1)
        group = bipartite_layout(current, state.prefix) if self.order == "bipartite" else None
        in_layout = group is None or bool((group.masked_fill(~current, 3).diff(dim=1) >= 0).all())
        if bool((keep == current).all()) and in_layout:
            return x
        if bool(merged.any()):
            x = merge_into_partners(x, state, merged, dst)
        return _compact(x, state, keep, alive & ~keep, group)


def flops_ratio(kept: Sequence[Union[torch.Tensor, float, None]], num_tokens: int,
                dim: int) -> Union[torch.Tensor, float]:
    """LTMP's FLOPs ratio (the paper's FLOPs loss; docs/methods.md, "LTMP"): the mean over blocks of
    ``[2*m_prev*n*C^2 + (m_prev*n)^2*C + 4*m*n*C^2] / (6*n*C^2 + n^2*C)``.

    ``kept[i]`` is the kept fraction ``m`` after block ``i`` (a tensor per image or a number;
    ``None``: block ``i`` does not reduce, ``m`` stays); ``m_prev`` is 1 before block 0.
    """
    n, c = float(num_tokens), float(dim)
    full = 6 * n * c * c + n * n * c
    total: Union[torch.Tensor, float] = 0.0
    prev: Union[torch.Tensor, float] = 1.0
    for m in kept:
        m = prev if m is None else m
        total = total + (2 * prev * n * c * c + (prev * n) ** 2 * c + 4 * m * n * c * c) / full
        prev = m
    return total / max(len(kept), 1)


@dataclass(frozen=True)
class CostModel(cost.CostModel):
    """The MACs of one image's inference forward of an LTMP-reduced ViT as a function of the
    token counts, term by term as ``vitbench.measure.count_gmacs`` counts them (matched compute,
    ``gmacs_fraction``; docs/methods.md, "LTMP").

    Block ``i`` runs its attention on the ``n'`` tokens it receives and its MLP on the ``n`` it
    keeps (the reduction sits between them), so with ``n'`` = ``num_tokens`` before block 0 its
    MACs are ``linear[i] * n' + quadratic[i] * n'^2 + match[i] * |A| |B| + mlp[i] * n``:
    ``linear`` the attention's Linear layers (qkv, proj) per token, ``quadratic`` ``QK^T`` and
    ``A V`` (``2 * heads * head_dim``), ``match`` LTMP's own similarity matmul of the ``|A|`` by
    ``|B|`` split (:func:`best_partners`; ``head_dim`` where the block reduces, else 0) and ``mlp``
    the MLP's Linear layers per token. ``fixed`` is what no token count changes (the patch
    embedding and the head(s)), counted (:func:`vitbench.kit.cost.counted_fixed`). The unreduced
    model costs :attr:`full` (no matching); softmax, norms and element-wise ops are not counted,
    as by the counter.
    """

    num_tokens: int
    prefix: int
    fixed: float
    linear: tuple[float, ...]
    quadratic: tuple[float, ...]
    match: tuple[float, ...]
    mlp: tuple[float, ...]

    @property
    def full(self) -> float:
        """MACs of the unreduced model (the baseline the GMACs fraction is taken of)."""
        n = float(self.num_tokens)
        return self.fixed + sum(a * n + b * n * n + c * n for a, b, c in zip(self.linear, self.quadratic, self.mlp))

    def terms(self, kept: Sequence[Union[torch.Tensor, float, None]]) -> Iterator[Union[torch.Tensor, float]]:
        """Each block's terms for the kept fractions ``kept[i]`` after block ``i`` (a tensor per
        image or a number, of all ``num_tokens`` tokens, prefix included; ``None``: block ``i``
        does not reduce). Differentiable in ``kept``; exact when ``kept[i] * num_tokens`` are
        integers."""
        n_tok = float(self.num_tokens)
        prev: Union[torch.Tensor, float] = n_tok
        for i, m in enumerate(kept):
            n = prev if m is None else m * n_tok
            patches = prev - self.prefix
            # |A| |B| = floor(P/2) ceil(P/2) = (P^2 - P mod 2) / 4 for P patch tokens; the parity
            # is a constant for the gradient
            odd = (torch.round(patches.detach()) % 2 if isinstance(patches, torch.Tensor)
                   else float(round(patches) % 2))
            pairs = (patches * patches - odd) / 4
            yield self.linear[i] * prev
            yield self.quadratic[i] * prev * prev
            yield self.match[i] * pairs
            yield self.mlp[i] * n
            prev = n


def cost_model(model: nn.Module, info: ModelInfo, reducing: Sequence[bool],
               image: Optional[torch.Tensor] = None) -> CostModel:
    """The :class:`CostModel` of ``model`` (a timm ViT, reduced or not), ``reducing[i]``: block
    ``i`` has an LTMP reducer. The blocks' terms are read off their modules
    (:func:`vitbench.kit.vit_block_costs`); the fixed part is counted on ``image`` (default: a
    zero image of the model's input size), less the terms of the tokens that forward kept.
    ``tests/plugins/test_ltmp.py`` checks it against ``count_gmacs``.
    """
    blocks = vit_block_costs(model, info.embed_dim)
    terms = CostModel(num_tokens=info.num_tokens, prefix=info.num_prefix_tokens, fixed=0.0,
                      linear=blocks.linear, quadratic=blocks.quadratic,
                      match=tuple(float(d) if reduces else 0.0 for d, reduces in zip(blocks.head_dim, reducing)),
                      mlp=blocks.mlp)

    def counted_terms() -> float:
        ctx = reduction_context(model)
        counts = ctx.state.private.get(_COUNTS) if ctx is not None and ctx.state is not None else None
        if not counts:  # an unreduced model: no matching, every token to the end
            return terms.full
        return float(terms.macs([float(counts[b][0]) / info.num_tokens if b in counts else None
                                 for b in range(len(reducing))]))

    if image is None:
        image = cost.probe_image(model, tuple(model.patch_embed.img_size))
    return replace(terms, fixed=cost.counted_fixed(model, image, counted_terms))


def flops_penalty_of(params: LTMPParams, info: ModelInfo) -> Callable[..., Optional[torch.Tensor]]:
    """The train stage's ``extra_loss``: ``lambda * (flops_ratio - target)^2`` of the last forward
    (the paper's ratio, :func:`flops_ratio`); with ``params.gmacs_fraction`` set,
    ``lambda * (gmacs_ratio - gmacs_fraction)^2``, ``gmacs_ratio`` the model's exact cost
    (:class:`CostModel`, built at the first training forward) as a fraction of the
    unreduced model's.

    Matched compute does not set ``target`` to ``F``: the paper's ratio weighs the blocks' terms
    otherwise than the counted GMACs do, so no single ``target`` stands for ``F``; the counted
    cost itself is the mapping that holds (docs/methods.md, "LTMP" gives the measurements).

    The reducers leave their straight-through kept fractions in the forward's token state
    (``state.private["ltmp_kept"]``: a reducer is handed the state, not the context, and
    ``ctx.extras`` is a new dict every forward); the penalty reads them from there and puts the
    batch's ratio and the per-block kept fractions into ``ctx.extras`` (detached, for logging)
    as ``"ltmp_flops_ratio"`` and ``"ltmp_kept"``.
    """
    ratio_of = _vit_ratio(params, info)
    goal = _goal(params)

    def flops_penalty(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        ctx = reduction_context(model)
        kept = ctx.state.private.get(_KEPT) if ctx is not None and ctx.state is not None else None
        if not kept:
            return None  # an inference forward: nothing was masked
        ratio = ratio_of(model, [kept.get(i) for i in range(info.depth)]).mean()  # type: ignore[union-attr]
        ctx.extras["ltmp_flops_ratio"] = ratio.detach()
        ctx.extras["ltmp_kept"] = {i: m.detach().mean() for i, m in kept.items()}
        return params.lambda_flops * (ratio - goal) ** 2

    return flops_penalty


def _goal(params: LTMPParams) -> float:
    """What the penalty and the calibration aim at: ``gmacs_fraction`` if set, else ``target``."""
    return params.target if params.gmacs_fraction is None else params.gmacs_fraction


def _reducing(params: LTMPParams, info: ModelInfo) -> list[bool]:
    layers = tuple(range(info.depth)) if params.layers is None else params.layers
    return [i in layers for i in range(info.depth)]


def _vit_ratio(params: LTMPParams, info: ModelInfo
               ) -> Callable[[nn.Module, Sequence[Union[torch.Tensor, None]]], Union[torch.Tensor, float]]:
    """``ratio(model, kept)``: each image's cost ratio for the kept fractions ``kept[i]`` after
    block ``i`` (``[B]``; ``None``: block ``i`` does not reduce): the paper's FLOPs ratio, or with
    ``gmacs_fraction`` set the counted cost over the unreduced model's (:class:`CostModel`, built
    at the first call)."""
    reducing = _reducing(params, info)
    costs: dict[int, CostModel] = {}  # id(model) -> its cost model, read once

    def ratio(model: nn.Module, kept: Sequence[Union[torch.Tensor, None]]) -> Union[torch.Tensor, float]:
        if params.gmacs_fraction is None:
            return flops_ratio(kept, info.num_tokens, info.embed_dim)
        if id(model) not in costs:
            costs[id(model)] = cost_model(model, info, reducing)
        return costs[id(model)].ratio(kept)

    return ratio


def _vit_counted(params: LTMPParams, info: ModelInfo) -> Callable[[nn.Module, int], torch.Tensor]:
    """The calibration's ``ratio_of``: each image's cost ratio (:func:`_vit_ratio`) of the eval
    forward that has just run, from the token counts it kept."""
    ratio = _vit_ratio(params, info)

    def ratio_of(model: nn.Module, images: int) -> torch.Tensor:
        ctx = reduction_context(model)
        counts = ctx.state.private.get(_COUNTS, {}) if ctx is not None and ctx.state is not None else {}
        kept = [counts[i].double() / info.num_tokens if i in counts else None for i in range(info.depth)]
        return torch.as_tensor(ratio(model, kept)).expand(images)

    return ratio_of


def calibration_stage(params: LTMPParams, ratio_of: Callable[[nn.Module, int], torch.Tensor],
                      goal: float) -> Optional[TrainStage]:
    """The stage after training that scales the thresholds onto ``goal`` on training images
    (:mod:`vitbench_plugins.ltmp.calibration`); ``None`` where ``params.calibrate`` says not to:
    ``matched`` calibrates only at matched compute (``gmacs_fraction`` set)."""
    if params.calibrate == "never" or (params.calibrate == "matched" and params.gmacs_fraction is None):
        return None

    def before(model: nn.Module, batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]
               ) -> dict[str, float]:
        images = first_images(batches, calibration.IMAGES)
        if images is None:
            raise ValueError("ltmp: the calibration has no training images")
        reducers = [m for m in model.modules() if isinstance(m, LTMPReducer)]
        found = calibration.calibrate(model, reducers, images, ratio_of, goal)
        return {f"calibration_{k}": v for k, v in found.items()}

    return TrainStage(name="calibration", epochs=0, trainable=("theta_m", "theta_p"), before=(before,))


def clamp_thresholds(model: nn.Module) -> None:
    """``after_step``: clamp every LTMP threshold of ``model`` to ``[0, 1]`` (docs/methods.md, "LTMP")."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LTMPReducer):
                module.theta_m.clamp_(0.0, 1.0)
                module.theta_p.clamp_(0.0, 1.0)


def kept_tokens(model: nn.Module) -> torch.Tensor:
    """Tokens ``[B]`` each image had after the last reducing block of the last eval forward."""
    ctx = reduction_context(model)
    counts = ctx.state.private.get(_COUNTS) if ctx is not None and ctx.state is not None else None
    if not counts:
        raise ValueError("no ltmp inference forward has run on this model yet")
    return counts[max(counts)]


_TILE = "ltmp_tile"  # the tile step's (keep mask, merge weights, destinations), for its unmerge


class LTMPTileReducer(LTMPReducer, TileUnmerge):
    """LTMP in a Swin block (docs/methods.md, "LTMP", "On Swin"): each tile of the map (a fresh sequence of ``t``
    tokens, no prefix) is merged by the block's ``theta_m`` and pruned by its ``theta_p`` for the
    MLP only; the residual stream keeps every token.

    - merging: the bipartite matching of :func:`best_partners` on the tile's keys (the split by
      position in the tile), a token merged into its partner when the similarity exceeds
      ``theta_m``;
    - pruning: the importance is the attention the token receives in its (shifted) window,
      averaged over heads and the window's queries (the adapter's ``received_attn``); a
      destination takes the max of its group; ``<= theta_p`` is pruned, each tile's most
      important token never;
    - inference: merged and pruned tokens stay in place with size 0: the adapter runs the MLP on
      the others only (packed, no padding computed); :meth:`unmerge` hands a merged token its
      destination's MLP output and a pruned one (or one merged into a pruned destination) none;
    - training: nothing is removed; the straight-through keep mask ``m = (1 - merge) * prune``
      scales the MLP output, ``y_i = m_i mlp_i + merge_i m_dst(i) mlp_dst(i)``, the same forward
      as inference with gradients to both thresholds.
    """

    needs = frozenset({"keys", "received_attn"})

    def __init__(self, index: int, tau: float, kept: dict[int, torch.Tensor], **kwargs: float) -> None:
        super().__init__(index, tau, **kwargs)  # type: ignore[arg-type]
        self._kept = kept  # shared by the model's reducers (not in the state dict): m per block

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        received = getattr(info, "received", None)
        if info.keys is None or received is None:
            raise ValueError("ltmp on swin needs the block's keys and received attention (needs "
                             "'keys', 'received_attn')")
        b, n, _ = x.shape
        current = torch.ones(b, n, device=x.device, dtype=torch.bool)
        best, dst = best_partners(info.keys, current, 0)
        if self.training:
            merge = straight_through(best, self.theta_m, self.tau)  # 0 (no grad) outside A
        else:
            merge = (best > self.theta_m).to(x.dtype)
        merged = merge.detach() > 0.5
        state.source = None  # the tile's way back is (mask, merge, dst): no sources to keep up
        x = merge_into_partners(x, state, merge, dst)
        importance = group_importance(received, dst, merged)
        alive = ~merged
        protected = _protected(alive, importance, 0)
        if self.training:
            prune = straight_through(importance, self.theta_p, self.tau)
            keep = (1.0 - merge) * torch.where(protected, torch.ones_like(prune), prune)
            self._kept[self.index] = keep.mean(dim=1)
        else:
            keep = (alive & ((importance > self.theta_p) | protected)).to(x.dtype)
            state.size = state.sizes(x) * keep[..., None]  # size 0: the adapter leaves it out of the MLP
            self._kept[-1 - self.index] = keep.detach().mean(dim=1)
        state.private[_TILE] = (keep, merge, dst)
        return x

    def unmerge(self, y: torch.Tensor, state: TokenState) -> torch.Tensor:
        """The MLP output ``y [B*nT, t, C]`` back on the tile's tokens: ``y_i m_i`` plus, for a
        token merged into ``dst(i)``, ``m_dst(i) y_dst(i)`` (class doc)."""
        keep, merge, dst = state.private[_TILE]
        kept = y * keep[..., None].to(y.dtype)
        return kept + merge[..., None].to(y.dtype) * kept.gather(1, dst[..., None].expand_as(kept))


@dataclass(frozen=True)
class SwinCostModel(cost.CostModel):
    """The MACs of one image's inference forward of an LTMP-reduced Swin as a function of each
    block's kept fraction ``m_i`` (of its ``tokens[i]`` map tokens), as ``count_gmacs`` counts
    them: ``mlp[i]`` per token kept and ``match[i]`` the block's bipartite matching (``tiles *
    floor(t/2) ceil(t/2) * head_dim``; 0 where it does not reduce); ``fixed`` (patch embedding,
    every attention on every token, the patch merging layers, the head) is counted
    (:func:`vitbench.kit.cost.counted_fixed`)."""

    fixed: float
    tokens: tuple[int, ...]
    mlp: tuple[float, ...]
    match: tuple[float, ...]

    @property
    def full(self) -> float:
        """MACs of the unreduced model."""
        return self.fixed + sum(c * n for c, n in zip(self.mlp, self.tokens))

    def terms(self, kept: Sequence[Union[torch.Tensor, float, None]]) -> Iterator[Union[torch.Tensor, float]]:
        """Each block's terms for the kept fractions ``kept[i]`` (``None``: block ``i`` does not reduce)."""
        for m, c, n, match in zip(kept, self.mlp, self.tokens, self.match):
            yield c * n * (1.0 if m is None else m)
            yield match


def swin_cost_model(model: nn.Module, reducing: Sequence[bool], image: Optional[torch.Tensor] = None
                    ) -> SwinCostModel:
    """The :class:`SwinCostModel` of a timm ``SwinTransformer`` or ``SwinTransformerV2`` (reduced
    or not): the blocks' terms read off their modules, the fixed part counted on ``image``
    (default: a zero image of the model's input size), less the terms of the tokens that forward
    kept; ``tests/plugins/test_ltmp_swin.py`` (V1) and ``tests/engine/families/test_swinv2.py``
    (V2) check it against ``count_gmacs``."""
    # torch: when the method is built; registering the plugin stays light
    from vitbench.kit import tile_of

    tokens, mlp, match = [], [], []
    i = 0
    for stage in model.layers:
        blocks = [getattr(blk, "block", blk) for blk in stage.blocks]
        h, w = (int(s) for s in blocks[0].input_resolution)
        for blk in blocks:
            head_dim = blk.dim // blk.attn.num_heads
            th, tw = tile_of((h, w), tuple(blk.window_size))
            t = th * tw
            tokens.append(h * w)
            mlp.append(linear_macs(blk.mlp))
            match.append(float(h * w // t * (t // 2) * ((t + 1) // 2) * head_dim) if reducing[i] else 0.0)
            i += 1
    terms = SwinCostModel(fixed=0.0, tokens=tuple(tokens), mlp=tuple(mlp), match=tuple(match))

    def counted_terms() -> float:
        if not any(isinstance(m, LTMPTileReducer) for m in model.modules()):
            return terms.full  # unreduced: every token through every MLP, no matching
        kept = swin_kept(model)
        total = 0.0
        for b, (c, n, match_b) in enumerate(zip(mlp, tokens, terms.match)):
            # whole tokens: each tile's kept fraction (float32) times the tile's size
            n_kept = round(float((kept[b].double() * (n / kept[b].numel())).round().sum())) if b in kept else n
            total += c * n_kept + match_b
        return total

    if image is None:
        image = cost.probe_image(model, tuple(model.patch_embed.img_size))
    return replace(terms, fixed=cost.counted_fixed(model, image, counted_terms))


def _swin_penalty(params: LTMPParams, info: ModelInfo,
                  kept: dict[int, torch.Tensor]) -> Callable[..., Optional[torch.Tensor]]:
    """The Swin penalty: ``lambda * (ratio - goal)^2`` with ``ratio`` the counted cost
    (:class:`SwinCostModel`) over the unreduced one and ``goal`` ``gmacs_fraction`` if set, else
    ``target`` (docs/methods.md, "LTMP", "On Swin": the paper's ViT ratio does not describe a reduction that
    leaves attention whole)."""
    reducing = _reducing(params, info)
    goal = _goal(params)
    costs: dict[int, SwinCostModel] = {}

    def flops_penalty(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        per_block = [kept.get(i) if reducing[i] else None for i in range(info.depth)]
        if not any(m is not None for m in per_block):
            return None
        if id(model) not in costs:
            costs[id(model)] = swin_cost_model(model, reducing)
        ratio = costs[id(model)].ratio([None if m is None else m.mean() for m in per_block])
        ctx = reduction_context(model)
        if ctx is not None:
            ctx.extras["ltmp_flops_ratio"] = ratio.detach()  # type: ignore[union-attr]
            ctx.extras["ltmp_kept"] = {i: m.detach().mean() for i, m in enumerate(per_block) if m is not None}
        for i in range(info.depth):  # this forward's masks are used up
            kept.pop(i, None)
        return params.lambda_flops * (ratio - goal) ** 2

    return flops_penalty


def _swin_counted(params: LTMPParams, info: ModelInfo) -> Callable[[nn.Module, int], torch.Tensor]:
    """The calibration's ``ratio_of`` on Swin: each image's counted cost ratio
    (:class:`SwinCostModel`) of the eval forward that has just run, from its tiles' kept fractions."""
    reducing = _reducing(params, info)
    costs: dict[int, SwinCostModel] = {}

    def ratio_of(model: nn.Module, images: int) -> torch.Tensor:
        kept = swin_kept(model)
        per_image = [kept[i].double().reshape(images, -1).mean(dim=1) if reducing[i] and i in kept else None
                     for i in range(info.depth)]
        if id(model) not in costs:
            costs[id(model)] = swin_cost_model(model, reducing)
        return torch.as_tensor(costs[id(model)].ratio(per_image)).expand(images)

    return ratio_of


def swin_kept(model: nn.Module) -> dict[int, torch.Tensor]:
    """Swin: the kept fraction ``[B*nT]`` of each tile of each reducing block in the last eval
    forward (tokens the MLP ran on / tile size)."""
    for module in model.modules():
        if isinstance(module, LTMPTileReducer):
            return {-1 - k: v for k, v in module._kept.items() if k < 0}
    raise ValueError("this model is not a Swin reduced with ltmp")


def build(params: LTMPParams, info: ModelInfo) -> Reduction:
    layers = tuple(range(info.depth)) if params.layers is None else params.layers
    for layer in layers:
        if not 0 <= layer < info.depth:
            raise ParamError(f"ltmp.layers contains {layer}; valid block indices for this model: "
                             f"0..{info.depth - 1}")
    if info.family == "swin":
        kept: dict[int, torch.Tensor] = {}
        reducers: list[Optional[nn.Module]] = [LTMPTileReducer(i, params.tau, kept)
                                               if i in layers else None for i in range(info.depth)]
        penalty = _swin_penalty(params, info, kept)
        counted = _swin_counted(params, info)
    else:
        reducers = [LTMPReducer(i, params.tau, order=params.order)
                    if i in layers else None for i in range(info.depth)]
        penalty = flops_penalty_of(params, info)
        counted = _vit_counted(params, info)
    stage = TrainStage(
        name="thresholds",
        epochs=params.epochs,
        optimizer=params.optimizer,
        lr=params.lr_merge,
        weight_decay=0.0,
        momentum=0.0,  # plain SGD
        schedule="cosine",
        lr_groups=(("theta_m", params.lr_merge), ("theta_p", params.lr_prune)),
        label_smoothing=params.label_smoothing,
        batch_size=params.batch_size,
        trainable=("theta_m", "theta_p"),
        extra_loss=penalty,
        clip_grad_value=params.max_grad,  # after DDP's average: two ranks train as one process
        after_step=(clamp_thresholds,),
    )
    goal = _goal(params)
    calibrate = calibration_stage(params, counted, goal)
    return Reduction(reducers, prop_attn=True, train=(stage,) if calibrate is None else (stage, calibrate))
