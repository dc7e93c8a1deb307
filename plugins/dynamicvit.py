"""DynamicViT: learned, hierarchical token pruning (Rao et al., *DynamicViT: Efficient Vision
Transformers with Dynamic Token Sparsification*, NeurIPS 2021; docs/methods.md §16).

A prediction module (paper §3.2) at each listed block scores the patch tokens from local and
mask-averaged global features. Training (§3.3) masks tokens with a straight-through
Gumbel-softmax, applied to later blocks as an attention key bias, and adds the keep-ratio loss
(§3.4); only the predictors train. Inference keeps the ``ceil(rho^s * N_p)`` most probable
patches at stage ``s``, in position order. The distillation losses are left out.

Parameters: ``keep`` (the paper's ``rho``), ``layers`` (default ``(3, 6, 9)`` as ``topk``/``ppt``),
``ratio_weight`` (``lambda_ratio``), ``tau`` (Gumbel temperature), ``epochs``, ``lr``,
``batch_size``. docs/methods.md §16 lists every choice and where vitbench differs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, TrainStage
from vitbench.engine import AttnInfo, Reducer, TokenState, reduction_context
from vitbench.engine.masks import straight_through_mask
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.kit import check_layers, top_tokens

#: the key-mask floor in training: ``key_bias = log(mask + MASK_EPS)`` (docs/methods.md §16)
MASK_EPS = 1e-12
_MASK = "dynamicvit_mask"  # training: [B, N_p] straight-through keep mask of the patch tokens
_KEPT = "dynamicvit_kept"  # training: {stage: [B] kept fraction of the patch tokens}
_PATCHES = "dynamicvit_patches"  # patch tokens entering the first stage (N_p)


@dataclass(frozen=True)
class DynamicViTParams:
    """``keep``: the paper's keep ratio ``rho`` (stage ``s`` keeps ``ceil(rho^s N_p)`` patches);
    ``layers``: the blocks with a prediction module (one stage each, in order);
    ``ratio_weight``: weight of the keep-ratio loss (the paper's ``lambda_ratio``); ``tau``:
    Gumbel-softmax temperature; ``epochs``, ``lr``, ``batch_size``: the fine-tuning of the
    prediction modules (AdamW, cosine schedule)."""

    keep: float = 0.7
    layers: tuple[int, ...] = (3, 6, 9)
    ratio_weight: float = 2.0
    tau: float = 1.0
    epochs: int = 1
    lr: float = 1e-2
    batch_size: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"dynamicvit.keep={self.keep} is out of range; it must be in (0, 1]")
        if len(self.layers) == 0:
            raise ParamError("dynamicvit.layers=[] is out of range; it must list at least one block")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"dynamicvit.layers={list(self.layers)}: block indices are >= 0")
        if len(set(self.layers)) != len(self.layers):
            raise ParamError(f"dynamicvit.layers={list(self.layers)} is out of range; each block may "
                             f"be listed once")
        if not self.ratio_weight >= 0.0:
            raise ParamError(f"dynamicvit.ratio_weight={self.ratio_weight} is out of range; it must be >= 0")
        if not self.tau > 0.0:
            raise ParamError(f"dynamicvit.tau={self.tau} is out of range; the temperature must be > 0")
        if self.epochs < 1:
            raise ParamError(f"dynamicvit.epochs={self.epochs} is out of range; it must be >= 1")
        if not self.lr > 0.0:
            raise ParamError(f"dynamicvit.lr={self.lr} is out of range; it must be > 0")
        if self.batch_size < 1:
            raise ParamError(f"dynamicvit.batch_size={self.batch_size} is out of range; it must be >= 1")


def stage_count(keep: float, stage: int, patches: int) -> int:
    """Patch tokens kept after stage ``stage`` (from 1) of ``patches``: ``ceil(keep^stage *
    patches)``, a value within 1e-9 of an integer taken as that integer, at least 1."""
    target = keep ** stage * patches
    return max(1, min(patches, math.ceil(target - 1e-9)))


class KeepPredictor(nn.Module):
    """The paper's prediction module (§3.2): keep/drop log-probabilities ``[B, N_p, 2]`` of the
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
    check_layers("dynamicvit", params.layers, info.depth)
    stage_of = {layer: s + 1 for s, layer in enumerate(sorted(params.layers))}
    reducers = [DynamicViTReducer(stage_of[i], info.embed_dim, params.keep, params.tau) if i in stage_of else None
                for i in range(info.depth)]
    stage = TrainStage(
        name="predictor",
        epochs=params.epochs,
        optimizer="AdamW",
        lr=params.lr,
        weight_decay=0.0,
        schedule="cosine",
        batch_size=params.batch_size,
        trainable=("predictor",),
        extra_loss=ratio_penalty_of(params),
    )
    return Reduction(reducers, prop_attn=True, train=(stage,))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dynamicvit",
        kind="pruning",
        params=DynamicViTParams,
        build=build,
        families=("vit",),
        needs_training=True,
        # rho: the fraction of patch tokens kept per stage; counts (and GMACs) are fixed by it,
        # trained or not, so the knob can be searched on the untrained model
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="DynamicViT: learned prediction modules keep the top rho^s of the patch tokens "
                    "at each stage (trains the predictors with a keep-ratio loss)",
    ))
