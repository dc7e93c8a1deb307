"""DynamicViT: learned, hierarchical token pruning (Rao et al., *DynamicViT: Efficient Vision
Transformers with Dynamic Token Sparsification*, NeurIPS 2021; docs/methods.md, DynamicViT).

A lightweight **prediction module** (paper §3.2) sits at each listed block and decides which
patch tokens go on. At stage ``s`` (the ``s``-th listed block, ``s = 1 .. S``) it reads the
current tokens ``x`` and the decision mask ``D^`` so far (all ones before the first stage):

- local features ``z_local = MLP(x)`` (``LayerNorm, Linear(C, C'), GELU``; the paper's
  ``C' = C/2``);
- a global feature ``z_global = Agg(MLP(x), D^) = sum_i D^_i z_local_i / sum_i D^_i`` (the
  same ``MLP(x)``, averaged over the tokens still kept: the paper's ``Agg``);
- ``z_i = [z_local_i, z_global]`` and ``pi = Softmax(MLP(z))`` ``[N_p, 2]``, ``pi_i0`` the
  probability of dropping token ``i``, ``pi_i1`` of keeping it (computed as log-probabilities).

**Training** (``reducer.training``; paper §3.3): tokens are *masked, not removed*. The stage's
decision is a hard Gumbel-softmax sample of ``pi`` (straight-through), multiplied into the mask,
``D = D^ * GumbelSoftmax(pi)_{:,1}``, so a dropped token never comes back. The mask acts as an
attention mask on every later block (*attention masking*): a dropped token receives no attention
from any token (``state.key_bias = log(D + 1e-12)``, prefix tokens 1), so the kept tokens and
the class token compute exactly what they would without it. The loss is
``CE + ratio_weight * L_ratio``, ``L_ratio = 1/(B S) sum_b sum_s (rho^s - mean_i D_i^{b,s})^2``
(paper §3.4, the kept fraction of the patch tokens per image and stage against the target
``rho^s``); the penalty is the train stage's ``extra_loss``. Only the prediction modules train
(the backbone stays frozen unless ``--train-backbone``).

**Inference** (``eval()``; paper §3.4): each stage keeps the
``ceil(rho^s * N_p)`` patch tokens with the highest keep probability ``pi_i1`` (``N_p`` the
patch count entering the first stage) and removes the others for real (``state.keep``); the
prefix tokens stay first and the kept patches keep their order. Counts are fixed, so the batch
stays rectangular and the GMACs depend on ``keep`` only (an untrained predictor keeps as many
tokens as a trained one).

Choices the paper leaves open, or where vitbench differs (this module is the reference):

- **Where it acts.** vitbench's hook is after a block's attention residual, before its MLP
  (docs/methods.md §0). A listed block ``l`` therefore runs its attention on all incoming tokens
  and its MLP on the kept ones, and the predictor reads the tokens after that attention
  residual. The paper's modules sit *before* its 4th, 7th and 10th blocks (0-indexed 3, 6, 9),
  so there block ``l``'s attention already runs on the kept tokens. Default ``layers=(3, 6, 9)``,
  as ``topk``/``ppt``, so the methods compare directly; it costs a little more than the paper's
  placement (DeiT-S: 3.07 GMACs; ``layers=(2, 5, 8)``, which also prunes block ``l-1``'s MLP:
  2.82; the paper reports 2.9 GFLOPs).
- **Prediction-module widths.** ``MLP(x)``: ``LayerNorm(C), Linear(C, C/2), GELU`` (the
  paper's ``C' = C/2``, one projection feeding both the local and the global feature as in its
  equations). The scoring ``MLP(z)``: ``Linear(C, C/2), GELU, Linear(C/2, C/4), GELU,
  Linear(C/4, 2)``, then log-softmax (widths halving; at least 1). PyTorch's default
  initialisation.
- **Gumbel-softmax.** Temperature ``tau = 1`` (a parameter). For two classes the Gumbel-softmax
  equals a Gumbel-sigmoid of ``log pi_1 - log pi_0`` (``vitbench.engine.masks``, the same
  straight-through mask as LTMP/LTM/DCS): hard ``0/1`` forward, soft gradient.
- **Attention mask.** The paper's mask keeps every token's attention to *itself*
  (``G_ii = 1``); vitbench's key bias is per key, so a dropped token's own row sees only the kept
  tokens. A dropped token's value never reaches a kept token, the class token or a later
  decision (each is multiplied by its ``D^_i = 0``), so the loss is the same; only the dropped
  tokens' own (unused) values differ. ``log(D + 1e-12)`` rather than ``log(D)``: the backward of
  ``log(0)`` is ``inf * 0 = NaN``; with ``1e-12`` a dropped key's attention weight is ``1e-12`` of
  an unmasked one's (below float32 resolution next to the kept tokens' weights) and its gradient
  is the paper's ``d/dG`` of the masked softmax.
- **Counts.** ``ceil(rho^s * N_p)`` per stage, taken of the patch count at the first stage (a
  value within ``1e-9`` of an integer counts as that integer, so float error never adds a token),
  at least one token, never more than are left. ``keep = 1`` keeps every token: the reducer is the
  identity in both modes (nothing to learn), and the model equals the unpatched one.
- **Order.** The kept patches stay in their order (``top_tokens(order="original")``); ties in
  the keep probability keep the lower position. Nothing after a pruning step depends on positions
  (attention, MLP and the class-token readout act on a set), so this changes no logit.
- **Ratio target.** ``rho^s`` as in the paper (the counts at inference are ``ceil`` of it).
- **Left out: the distillation losses** (paper §3.4: ``L_distill``, MSE between the kept
  tokens' final features and the unpruned teacher's; ``L_KL``, KL between teacher and student
  logits; both weight 0.5 in the paper). vitbench's fine-tuning loop has no teacher path, and a
  teacher forward per step would nearly double the cost of training; with the backbone frozen
  (vitbench's default) the teacher is the unreduced model and CE carries most of the signal.
- **Training recipe.** The paper trains the whole model for 30 epochs (AdamW, prediction-module
  lr ``1e-3 * batch/1024``, backbone at 0.01x). vitbench's default is a brief fine-tune of the
  prediction modules only: ``epochs=1``, AdamW, ``lr=1e-2`` at batch 64, no weight decay, cosine
  schedule. ``ratio_weight=2`` is the paper's ``lambda_ratio``. The learning rate is ours: on the
  default model (``finetune(limit=10000)``, 157 steps; top-1 on the first 500 test images,
  baseline 83.2 %, ``topk`` 81.4 %) ``lr=1e-2`` gave 81.2 / 79.0 / 80.2 % (three runs),
  ``1e-3`` 79.2 / 76.8 % (two runs), ``3e-3`` 72.4 %; untrained predictors 63-78 %. One short epoch does not
  bring the training kept fractions to ``rho^s`` (e.g. 0.96 / 0.50 / 0.28 or 0.71 / 0.71 / 0.63
  against 0.7 / 0.49 / 0.343: the CE pulls towards keeping tokens); inference keeps the fixed
  counts whatever they are, so only the ranking is learnt from them. ``ratio_weight=10`` (lr
  ``1e-2``) saturated stage 1 at keeping everything (77.4 %).
- **Prefix tokens** (class, distillation, registers) are never scored, masked or dropped
  (mask 1). A model without prefix tokens (``global_pool='avg'``): inference works as above;
  in training the family's average pool still counts masked tokens (as LTMP's training),
  a known limitation; class-token models (DeiT/ViT) are unaffected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, TrainStage
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.engine.masks import straight_through_mask
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench_plugins.ppt import check_layers, top_tokens

#: the key-mask floor in training: ``key_bias = log(mask + MASK_EPS)`` (module docstring)
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


class DynamicViTReducer(nn.Module):
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
