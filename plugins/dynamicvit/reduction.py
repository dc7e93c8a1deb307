"""The ``dynamicvit`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.dynamicvit`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn

from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, adamw_cosine, chosen_layers, reduction_context,
    straight_through_mask, top_tokens,
)
from vitbench_plugins.dynamicvit import DynamicViTParams


#: the key-mask floor in training: ``key_bias = log(mask + MASK_EPS)`` (docs/methods.md, "DynamicViT")
MASK_EPS = 1e-12
_MASK = "dynamicvit_mask"  # training: [B, N_p] straight-through keep mask of the patch tokens
_KEPT = "dynamicvit_kept"  # training: {stage: [B] kept fraction of the patch tokens}
_PATCHES = "dynamicvit_patches"  # patch tokens entering the first stage (N_p)


def stage_count(keep: float, stage: int, patches: int) -> int:
    """Patch tokens kept after stage ``stage`` (from 1) of ``patches``: ``ceil(keep^stage *
    patches)``, a value within 1e-9 of an integer taken as that integer, at least 1."""
    target = keep ** stage * patches
    return max(1, min(patches, math.ceil(target - 1e-9)))


class KeepPredictor(nn.Module):
    """The paper's prediction module (Sec. 3.2): keep/drop log-probabilities ``[B, N_p, 2]`` of the
    patch tokens ``x [B, N_p, C]`` from local features and their ``mask``-weighted mean."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        half, quarter = max(1, dim // 2), max(1, dim // 4)
        self.local = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, half), nn.GELU())
        self.score = nn.Sequential(nn.Linear(2 * half, half), nn.GELU(), nn.Linear(half, quarter), nn.GELU(),
                                   nn.Linear(quarter, 2))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``mask [B, N_p]``: the decision so far (``None``: every token is kept)."""
        z = self.local(x)
        if mask is None:
            glob = z.mean(dim=1, keepdim=True)
        else:
            w = mask[..., None].to(z.dtype)
            glob = (z * w).sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True).clamp_min(1e-6)
        return self.score(torch.cat([z, glob.expand_as(z)], dim=-1)).log_softmax(dim=-1)


class DynamicViTReducer(nn.Module, Reducer):
    """One stage of DynamicViT: masks the dropped tokens in training, removes them at inference."""

    needs: frozenset[str] = frozenset()  # reads only the tokens: the fused kernel stays

    def __init__(self, stage: int, dim: int, keep: float, tau: float) -> None:
        super().__init__()
        self.stage = stage
        self.keep_ratio = keep
        self.tau = tau
        self.predictor = KeepPredictor(dim)
        # inference until ``model.train()``: methods are applied to eval models (as LTMP)
        self.train(False)

    def extra_repr(self) -> str:
        return f"stage={self.stage}, keep={self.keep_ratio}, tau={self.tau}"

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        p = state.prefix
        patches = state.private.setdefault(_PATCHES, x.shape[1] - p)
        k = stage_count(self.keep_ratio, self.stage, patches)
        if k >= patches:  # keep = 1: nothing to drop, nothing to learn
            return x
        if self.training:
            return self._mask(x, state)
        return self._prune(x, state, k)

    def _prune(self, x: torch.Tensor, state: TokenState, k: int) -> torch.Tensor:
        """Inference: keep the ``k`` patches most likely kept, in their order."""
        p = state.prefix
        if k >= x.shape[1] - p:
            return x
        keep_logp = self.predictor(x[:, p:])[..., 1]
        return state.keep(x, top_tokens(keep_logp, k, p, order="original"))

    def _mask(self, x: torch.Tensor, state: TokenState) -> torch.Tensor:
        """Training: sample this stage's hard decision, fold it into the mask, mask the keys."""
        p = state.prefix
        prev = state.private.get(_MASK)
        logp = self.predictor(x[:, p:], prev)
        decision = straight_through_mask(logp[..., 1] - logp[..., 0], self.tau, noisy=True)
        mask = decision if prev is None else prev * decision
        state.private[_MASK] = mask
        state.private.setdefault(_KEPT, {})[self.stage] = mask.mean(dim=1)
        state.key_bias = key_bias_of(mask, p)
        return x


def key_bias_of(mask: torch.Tensor, prefix: int) -> torch.Tensor:
    """``[B, 1, 1, N]`` attention bias of the patch ``mask [B, N_p]``: ``log(mask + 1e-12)``,
    prefix tokens 0 (always attended)."""
    head = torch.ones(mask.shape[0], prefix, device=mask.device, dtype=mask.dtype)
    return torch.log(torch.cat([head, mask], dim=1) + MASK_EPS)[:, None, None, :]


def ratio_loss(kept: dict[int, torch.Tensor], keep: float) -> torch.Tensor:
    """The paper's ``L_ratio``: the mean over stages ``s`` and images of
    ``(keep^s - kept[s])^2``, ``kept[s] [B]`` the kept fraction of the patch tokens."""
    terms = torch.stack([(kept[s] - keep ** s) ** 2 for s in sorted(kept)])
    return terms.mean()


def ratio_penalty_of(params: DynamicViTParams) -> Callable[..., Optional[torch.Tensor]]:
    """The train stage's ``extra_loss``: ``ratio_weight * L_ratio`` of the last forward.

    The reducers leave their kept fractions in the forward's token state (a reducer is handed
    the state, not the context); the penalty reads them and puts the per-stage kept fractions
    and ``L_ratio`` into ``ctx.extras`` (detached, for logging) as ``"dynamicvit_kept"`` and
    ``"dynamicvit_ratio_loss"``. ``None`` when nothing was masked (inference, or ``keep = 1``).
    """

    def ratio_penalty(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        ctx = reduction_context(model)
        kept = ctx.state.private.get(_KEPT) if ctx is not None and ctx.state is not None else None
        if not kept:
            return None
        loss = ratio_loss(kept, params.keep)
        ctx.extras["dynamicvit_kept"] = {s: m.detach().mean() for s, m in kept.items()}
        ctx.extras["dynamicvit_ratio_loss"] = loss.detach()
        return params.ratio_weight * loss

    return ratio_penalty


def build(params: DynamicViTParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("dynamicvit", params.layers, info.depth)
    stage_of = {layer: s + 1 for s, layer in enumerate(sorted(layers))}
    reducers = [DynamicViTReducer(stage_of[i], info.embed_dim, params.keep, params.tau) if i in stage_of else None
                for i in range(info.depth)]
    stage = adamw_cosine("predictor", params, trainable=("predictor",), extra_loss=ratio_penalty_of(params))
    return Reduction(reducers, prop_attn=True, train=(stage,))
