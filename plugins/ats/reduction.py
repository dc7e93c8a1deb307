"""The ``ats`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.ats`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math

import torch

from vitbench.errors import UnsupportedError
from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, blocks_from_quarter, chosen_layers, cls_attn_score,
)
from vitbench_plugins.ats import ATSParams


#: ``state.private`` keys: real tokens (``[B, N]`` bool) and kept patch counts (``{block: [B]}``)
VALID = "ats_valid"
COUNTS = "ats_counts"


def sample_points(k: int) -> torch.Tensor:
    """The ``K`` fixed sample points ``(i - 1/2) / K``, ``i = 1 .. K`` (for reading and tests;
    :func:`sampled_tokens` uses them in closed form)."""
    return (torch.arange(k, dtype=torch.float64) + 0.5) / k


def sampled_tokens(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Which tokens inverse transform sampling keeps: ``[B, n]`` bool for ``scores [B, n] >= 0``
    (each row with a positive sum) and ``K = k`` points (module docstring, steps 2-3).

    The scores are sorted ascending (stable), their CDF normalised to end at 1, and token ``j``
    (in sorted order) is kept iff a point ``(i - 1/2)/K`` lies in ``(CDF_(j-1), CDF_j]``, i.e.
    ``floor(K CDF_j + 1/2) > floor(K CDF_(j-1) + 1/2)``.
    """
    s = scores.float().clamp_min(0.0)
    order = torch.sort(s, dim=-1, stable=True).indices
    cdf = s.gather(-1, order).cumsum(dim=-1)
    cdf = cdf / cdf[..., -1:].clamp_min(torch.finfo(cdf.dtype).tiny)
    drawn = torch.floor(k * cdf + 0.5).clamp(0, k)  # points up to CDF_j
    before = torch.cat([torch.zeros_like(drawn[..., :1]), drawn[..., :-1]], dim=-1)
    kept_sorted = drawn > before
    return torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)


class ATSReducer(Reducer):
    """One listed block's adaptive token sampler (module docstring)."""

    needs: frozenset[str] = frozenset({"cls_attn", "values"})  # the cls-attn scorer's

    def __init__(self, index: int, k: int) -> None:
        self.index = index
        self.k = k

    def __repr__(self) -> str:
        return f"ATSReducer(index={self.index}, k={self.k})"

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if info.cls_attn is None or info.values is None:
            raise ValueError("ats needs the block's class-token attention row and values")
        p = state.prefix
        valid = state.private.get(VALID)
        if valid is None:
            valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        real = valid[:, p:]
        scores = patch_scores(info, p, real)
        kept = sampled_tokens(scores, self.k) & real
        counts = kept.sum(dim=1)
        state.private.setdefault(COUNTS, {})[self.index] = counts
        if bool((kept == real).all()):
            return x  # nothing dropped in any image
        return compact(x, state, kept, counts)


def patch_scores(info: AttnInfo, prefix: int, real: torch.Tensor) -> torch.Tensor:
    """The ``cls-attn`` scores ``[B, N_p]`` of the real patches (0 on padding); an image whose
    scores are all 0 gets uniform scores over its real patches (module docstring)."""
    scores = cls_attn_score(info, prefix).float().masked_fill(~real, 0.0)
    empty = scores.sum(dim=1, keepdim=True) <= 0
    return torch.where(empty, real.float(), scores)


def compact(x: torch.Tensor, state: TokenState, kept: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Keep the prefix and the ``kept [B, N_p]`` patches (current order), padding every image to
    the batch's largest count with value 0, size 0 and key bias ``-inf`` (module docstring)."""
    b, n_p = kept.shape
    p = state.prefix
    width = int(counts.max())
    pos = torch.arange(n_p, device=x.device)
    first = torch.argsort(torch.where(kept, pos, pos + n_p), dim=1, stable=True)[:, :width]
    slot_real = torch.arange(width, device=x.device) < counts[:, None]  # [B, width]
    # padded slots point at token 0 (the class token, kept anyway), then are blanked below
    patches = torch.where(slot_real, first + p, torch.zeros_like(first))
    head = torch.arange(p, device=x.device).expand(b, p)
    x = state.keep(x, torch.cat([head, patches], dim=1))
    valid = torch.cat([torch.ones(b, p, dtype=torch.bool, device=x.device), slot_real], dim=1)
    state.private[VALID] = valid
    if bool(valid.all()):
        state.key_bias = None
        return x
    state.size = state.sizes(x) * valid[..., None].to(x.dtype)
    if state.source is not None:
        state.source = state.source * valid[..., None].to(state.source.dtype)
    bias = torch.zeros(valid.shape, device=x.device, dtype=x.dtype).masked_fill(~valid, float("-inf"))
    state.key_bias = bias[:, None, None, :]
    return x.masked_fill(~valid[..., None], 0.0)


def build(params: ATSParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("ats", params.layers, info.depth, blocks_from_quarter)
    if info.num_prefix_tokens < 1:
        raise UnsupportedError("ats needs a class token (its scores are the class token's attention "
                               "row); this model has no prefix tokens")
    k = max(1, math.ceil(params.keep * info.num_patches))
    reducers = [ATSReducer(i, k) if i in layers else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)
