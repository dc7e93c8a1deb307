"""DCS: differentiable channel selection, searched then retrained with the IB bound
(docs/methods.md §7; the IB bound of §6). No public implementation exists: this is the reference,
so every choice the paper leaves open is stated here.

DCS changes channels, not tokens: its token step returns ``x`` unchanged, and it acts through
the two channel hooks of :class:`~vitbench.engine.block.ReducingBlock`. One
:class:`DCSReducer` per block holds

- ``qk_mask`` (``arch`` both|qk): the input-dependent query/key channel mask
  ``theta = Linear(x)``, ``M = sigmoid((theta + g1 - g2)/tau)``, hard ``M > 0.5`` in the
  forward with a straight-through gradient, applied as ``softmax((Q*M)(K*M)^T/sqrt(d))`` -- one
  Linear shared by Q and K, or two with ``qk_mask=separate``. Its ``qk(q, k, x)`` hook runs after
  qk-norm, so the fused attention kernel is kept.
- ``mlp_gate`` (``arch`` both|out): the architecture logits ``alpha [C]`` of the
  attention-output/MLP channels, ``g = sigmoid((alpha + g1 - g2)/tau)`` (hard, straight-through)
  multiplied onto the MLP input and output through the ``mlp_forward(mlp, x)`` hook.
- ``tau``: the Gumbel temperature, a buffer (so a checkpoint carries it).

The mask modules live in :mod:`vitbench.engine.channel_select` and know nothing of the model
family. Everything family-specific here is finding each block's MLP (``ReducingBlock.block.mlp``)
and the last block (``model.blocks[-1]``, for the IB features).

**Hybrid backbones** (issue 4; docs/methods.md §7 "on EfficientViT: Q/K of each LiteMLA branch, and
the concatenated branch outputs feeding the projection"; the paper's DCS-MobileViT-S and
DCS-EfficientViT-B1):

- *MobileViT*: its transformer blocks are timm ViT ``Block`` s wrapped in ReducingBlocks by the
  mobilevit adapter; the same :class:`DCSReducer` serves them, sized per block from
  ``ModelInfo.blocks`` (widths 96/120/144 on mobilevit_xs).
- *EfficientViT*: one :class:`DCSLiteMLAReducer` per LiteMLA, through the hooks of
  :mod:`vitbench.engine.families.efficientvit`: the Q/K mask ``theta = Linear(x)`` on the
  LiteMLA's input map (one logit per q/k channel of every branch and head) multiplies the
  ReLU-kernel features ``phi(Q)``, ``phi(K)`` -- after the kernel, so the linear attention's
  similarity and its normaliser both lose the masked channels, as ``(Q*M)(K*M)^T`` does in §7;
  the architecture gate ``alpha`` sits on the concatenated branch outputs before ``proj``
  (EfficientViT's attention-output channels; its MLPs are MBConvs, not gated). The shrink slices
  ``proj.conv``'s input channels, skips the heads that lost every output channel (their
  attention and Q/K logits), and drops the q/k/v rows of the ``qkv`` and aggregation
  convolutions of every *head pair* none of whose heads is kept -- head ``t`` of the 1x1 branch
  and head ``h + t`` of the 5x5 branch are both computed from the same ``3d`` qkv rows, so only
  together do they free them (see :class:`DCSLiteMLAReducer`). Without that, DCS could not
  reach a 10% saving on EfficientViT-B1: ``proj`` is 8.7% of its MACs, the ``qkv`` conv 13%.
- The IB bound of the retraining reads the last stage's output map, spatially averaged
  (:func:`feature_module`): a hybrid has no final token sequence.
- *Swin* (issue 12): the same :class:`DCSReducer` per Swin block, sized from ``ModelInfo.blocks``;
  the swin adapter runs ``qk`` on the queries and keys of every window and ``mlp_forward`` on the
  whole map. The IB bound pools its last stage (``layers[-1]``, channels-last: :func:`channels_last`).
  On Swin V2 (cosine attention) the Q/K mask applies to the raw queries and keys, *before* their
  normalisation, so a logit is the cosine of the kept channels -- what a model without the
  masked channels computes, in the range its learned logit scale expects; masking after the
  normalisation would shrink every logit like an unseen temperature. The MLP gate runs before
  V2's post-norm ``norm2``.

Training is declared as two :class:`~vitbench.catalog.TrainStage` objects, never looped here:

1. ``search`` (``search_epochs``): alternate the weights (70% of the batches) and ``alpha``
   (30%, ``arch_keys=("alpha",)``, learning rate ``arch_lr``). Loss ``CE + lam * max(0,
   log(cost / (budget * baseline)))``: the user states a **compute budget**, the fraction of
   the baseline's GMACs to keep, and ``cost`` is a model of the *counted* GMACs of the whole
   network (:mod:`vitbench.engine.channel_budget`): everything DCS does not change (patch
   embedding, qkv, attention, proj, convolutions, head) is counted once with
   :func:`vitbench.measure.count_gmacs` at batch 1 on the first training image (the search's
   ``before``), and each block adds what DCS changes -- the gated MLP (``2 * N * H`` MACs per
   kept channel: ``fc1`` reads and ``fc2`` writes it), the Q/K mask Linears (``N * C * C``
   each; they cost and save nothing, see below), on EfficientViT ``proj``, the heads and head
   pairs still computed. ``cost`` is taken at the **hard decision** ``alpha > 0`` -- the
   architecture the shrink would keep now -- with the straight-through gradient of
   ``sigmoid(alpha / tau)`` (:meth:`~vitbench.engine.channel_select.ChannelGate.decision`), so
   the loss sees the GMACs the report will show, and the penalty is zero once they fit.
   ``tau`` starts at ``tau0`` and is multiplied by ``tau_decay`` after every search epoch
   (``epoch_end``). When the stage ends (``after``) the decision is **made to fit the budget**
   (:func:`~vitbench.engine.channel_budget.enforce_budget`): if the search kept more, the kept
   channels with the lowest ``alpha`` (on EfficientViT: the head pairs with the lowest mean
   ``alpha``) are dropped until the counted cost fits, and a warning on the ``vitbench.dcs``
   logger says how many; so "DCS keeps at most ``budget`` of the GMACs" holds by construction.
   Then the MLPs are shrunk: ``fc1`` and ``fc2`` become smaller ``nn.Linear`` modules under the
   same names, ``alpha`` is removed, and a buffer ``kept`` holds the channel indices the MLP
   output is scattered back to (the other channels add zero). A budget the model cannot reach
   even with every gated channel dropped is refused before training, naming the lowest
   reachable fraction.
2. ``retrain`` (``retrain_epochs``): the architecture is fixed (there is no ``alpha`` any more;
   ``trainable=("qk_mask",)``). Loss ``CE + eta * IB_bound`` once ``t_warm`` retraining epochs
   are done (docs/methods.md §6, Theorem 3.1), on the final block's output reduced to the mean of
   its patch tokens (:func:`vitbench.measure.ib.token_features`) -- the very features whose IB
   loss and bound vitbench reports, so the retraining lowers the reported quantity. (The
   pre-logits would serve as well; for a cls-token ViT they are one token, the patch mean
   summarises all of them.) Class centroids of the features and of the inputs and
   ``log Q(a|y)`` come from a statistics pass over the training data before the first epoch
   that uses the bound and after every epoch that precedes one, stored as buffers of
   ``blocks.<last>.reducer.ib`` together with the count of finished retraining epochs.

Choices the paper leaves open:

- **Frozen backbone** (vitbench's default fine-tuning setup): the "weights" of the search's
  weight steps and of the retraining are the DCS Linear layers (``theta``); the backbone,
  including the shrunk ``fc1``/``fc2``, stays frozen (the shrunk Linears inherit the frozen
  flag). The paper retrains the whole network; ``--train-backbone`` does that. With
  ``arch=out`` the method's only parameters are the ``alpha`` logits, fixed after the search, so
  no retrain stage is declared (vitbench's loop refuses a stage with nothing to train, and with
  a frozen backbone there is nothing); with ``--train-backbone`` the backbone then trains only in
  the search's weight steps. (In that ablation every search step updates ``alpha``: the loop
  falls back to the one optimiser there is.)
- **Hard gates in the search**: ``g`` is hard in the forward (straight-through), like ``M``,
  so the network the search evaluates is exactly a subnetwork and the one kept after it is the
  noise-free one, ``alpha > 0``.
- **Initialisation**: ``theta``'s Linear has zero weight and bias ``KEEP_LOGIT`` = 2, and
  ``alpha`` starts at 2: the untrained method keeps every channel at inference and equals the
  unpatched model; in training the Gumbel noise drops a channel with probability
  ``sigmoid(-2)`` = 12%, the search's exploration.
- **Inference until trained**: the reducers are built in eval mode (a new ``nn.Module`` would
  train), so a freshly applied model is deterministic; the fine-tuning loop's ``model.train()``
  turns the Gumbel noise on.
- **Temperature**: the hard mask does not depend on ``tau`` (``theta + noise > 0``); ``tau``
  scales the straight-through gradient and the cost's ``sigmoid(alpha/tau)``. The Q/K masks
  keep Gumbel noise in retraining, at the temperature the search ended with (no decay there).
- **Default ``arch=out``** (the paper's DCS-Arch2 ablation), because **the Q/K masks cost
  MACs and save none**: the mask is computed densely (one ``C x C`` Linear per token and
  block, two with ``separate``; on EfficientViT ``HW * C * 2C`` per LiteMLA) and a masked
  channel is still multiplied in the dense ``QK^T`` (the mask differs per token, so no channel
  can be sliced away). On the default ViT the mask Linears add 9.9% to the model's GMACs (the
  "+9.5%" DCS showed with the former ``lam=0.1``), on EfficientViT-B1 8.7% (as much as
  ``proj``). The
  paper reports the FLOPs of the searched architecture; vitbench counts what runs, and the
  budget counts the masks too: with ``arch=both`` the search must drop that many more MLP
  channels (the default ViT at ``budget=0.9``: half of them instead of a quarter),
  which costs more accuracy than input-dependent Q/K masks win back in a short fine-tuning.
  ``arch=both`` (the paper's full DCS) and ``arch=qk`` stay selectable; ``arch=qk`` drops
  nothing, so it needs ``budget=1`` and then enforces nothing (it always adds MACs).
- **budget** = 0.9 (the paper states FLOPs, not a budget): a saving of at least 10% on every
  family by construction, and reachable on every family -- the lowest fraction DCS can reach
  (every gated channel dropped) is 0.60 on the default ViT (its MLPs are 40% of the MACs),
  0.74 on EfficientViT-B1 at 224 px (proj, heads and head pairs) and 0.85 on MobileViT-XS at
  256 px (MLPs 15%; its convolutions dominate), so 0.85 would be refused there. On
  MobileViT-XS 0.9 means dropping about two thirds of the MLP channels.
- **lam** = 1.0: the penalty's weight, now only how hard the search pushes while it is over
  budget (the shrink enforces the budget anyway); the penalty is ``log(cost / target)``, so
  its gradient is relative (``d cost / cost``) and does not depend on the model's size.
- **eta** = 1.0 (the paper: 50, from epoch 90 of a 300-epoch training from scratch, where the
  bound regularises a network that has long fitted the data); in vitbench's short fine-tuning
  of a trained model a weight of 50 would swamp the cross-entropy. ``t_warm`` = 0: the bound is
  on from the first retraining epoch (``t_warm >= retrain_epochs`` switches it off).
- **Learning rates** for short CPU runs: ``lr`` = 1e-3 (AdamW) for ``theta``; ``arch_lr`` =
  0.1 for ``alpha``, so that in one search epoch of ~150 batches (~45 architecture steps; with
  ``arch=out`` every step is one) a channel the cost pushes steadily can cross from 2 to below
  0. Lower it for long searches.
- **Statistics memory**: the statistics pass keeps the features of the training set (``n x C``
  floats) for ``Q(a|y)``; the input centroids are summed on the fly and computed once.
- **Supported MLPs**: timm ``Mlp`` with Linear ``fc1``/``fc2``; any other MLP raises
  :class:`~vitbench.errors.UnsupportedError` (with ``arch`` both|out).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

import torch
from torch import nn

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, TrainStage
from vitbench.engine.attention import AttnInfo
from vitbench.engine.block import reduction_context
from vitbench.engine.channel_budget import ComputeBudget, enforce_budget
from vitbench.engine.channel_select import (
    ChannelGate,
    conv_output_channels,
    QKChannelMask,
    check_mlp,
    check_pointwise_proj,
    gated_mlp,
    shrink_mlp,
    shrink_proj_input,
    shrink_qk_mask,
    sparse_mlp,
)
from vitbench.engine.token_state import TokenState
from vitbench.errors import ParamError, UnsupportedError
from vitbench.hookspecs import hookimpl
from vitbench.measure.ib import (
    class_centroids,
    final_features,
    ib_terms,
    input_vectors,
    log_q_given_y,
    soft_assign,
    token_features,
)

ARCHS = ("both", "qk", "out")
QK_MASKS = ("shared", "separate")
OPTIMIZERS = ("SGD", "AdamW", "Adam")
#: share of the search's batches that update ``alpha`` (docs/methods.md §7: 70% weights, 30% alpha)
ARCH_FRACTION = 0.3
#: where the retraining's forward leaves the final block's tokens for the IB bound
_TOKENS_KEY = "dcs_final_tokens"


@dataclass(frozen=True)
class DCSParams:
    """DCS options (docs/methods.md §7); see the module docstring for the defaults' reasons."""

    arch: str = "out"
    qk_mask: str = "shared"
    tau0: float = 4.5
    tau_decay: float = 0.95
    budget: float = 0.9
    lam: float = 1.0
    search_epochs: int = 1
    retrain_epochs: int = 1
    t_warm: int = 0
    eta: float = 1.0
    lr: float = 1e-3
    arch_lr: float = 0.1
    optimizer: str = "AdamW"
    batch_size: int = 64

    def __post_init__(self) -> None:
        for name, value, valid in (("arch", self.arch, ARCHS), ("qk_mask", self.qk_mask, QK_MASKS),
                                   ("optimizer", self.optimizer, OPTIMIZERS)):
            if value not in valid:
                raise ParamError(f"dcs.{name}={value!r} is not valid; valid values: {', '.join(valid)}")
        for name in ("tau0", "lr", "arch_lr"):
            if not getattr(self, name) > 0:
                raise ParamError(f"dcs.{name}={getattr(self, name)} is out of range; it must be > 0")
        if not 0 < self.budget <= 1:
            raise ParamError(f"dcs.budget={self.budget} is out of range; it must be in (0, 1] (the "
                             f"fraction of the baseline's GMACs to keep)")
        if self.arch == "qk" and self.budget < 1:
            raise ParamError(f"dcs.budget={self.budget} cannot be met with dcs.arch='qk': it drops no "
                             f"channel (its Q/K mask Linears only add MACs); use arch=both|out for a "
                             f"budget, or budget=1 for the qk ablation (no budget enforced)")
        if not 0 < self.tau_decay <= 1:
            raise ParamError(f"dcs.tau_decay={self.tau_decay} is out of range; it must be in (0, 1]")
        for name in ("lam", "eta"):
            if not getattr(self, name) >= 0:
                raise ParamError(f"dcs.{name}={getattr(self, name)} is out of range; it must be >= 0")
        for name, low in (("search_epochs", 1), ("retrain_epochs", 0), ("t_warm", 0), ("batch_size", 1)):
            if getattr(self, name) < low:
                raise ParamError(f"dcs.{name}={getattr(self, name)} is out of range; it must be >= {low}")

    @property
    def uses_ib(self) -> bool:
        """Whether there is a retraining and it ever adds the IB bound."""
        return self.arch != "out" and self.eta > 0 and self.retrain_epochs > self.t_warm


class IBStatistics(nn.Module):
    """What the retraining's IB bound needs from the previous epoch (docs/methods.md §6), as buffers.

    ``feature_centroids [K, C]`` and ``input_centroids [K, D]`` (class centroids of the final
    features and of the inputs), ``log_q [K, K]`` (``log Q(a|y)``), ``epochs_done`` (finished
    retraining epochs, for ``t_warm``). Empty until the first statistics pass; a checkpoint
    carries them (``prepare_load`` gives an empty module the saved shapes).
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("feature_centroids", torch.zeros(0))
        self.register_buffer("input_centroids", torch.zeros(0))
        self.register_buffer("log_q", torch.zeros(0))
        self.register_buffer("epochs_done", torch.zeros((), dtype=torch.long))

    @property
    def ready(self) -> bool:
        return self.log_q.numel() > 0

    @torch.no_grad()
    def refresh(self, model: nn.Module, batches: Callable[[], Any]) -> None:
        """One pass over ``batches()`` in eval mode: centroids and ``log Q(a|y)`` of the model
        as it is now (LTM's Algorithm 1; DCS retrains with the same bound). The classes are
        ``model.num_classes`` (or more, if a label says so)."""
        device = self.log_q.device
        feats, labels = [], []
        input_sums: Optional[torch.Tensor] = None  # per class, summed once: inputs never change
        num_classes = int(getattr(model, "num_classes", 0) or 0)
        was_training = model.training
        model.eval()
        try:
            for images, y in batches():
                images, y = images.to(device), y.to(device).long()
                num_classes = max(num_classes, int(y.max()) + 1)
                feats.append(_final_features(model, images).float())
                labels.append(y)
                if not self.input_centroids.numel():
                    input_sums = _add_per_class(input_sums, input_vectors(images), y, num_classes)
        finally:
            model.train(was_training)
        if not feats:
            raise ValueError("dcs: the statistics pass of the IB bound got no training batches")
        f, y = torch.cat(feats), torch.cat(labels)
        self.feature_centroids = class_centroids(f, y, num_classes)
        self.log_q = log_q_given_y(soft_assign(f, self.feature_centroids), y, num_classes)
        if input_sums is not None:
            self.input_centroids = nn.functional.normalize(_grow(input_sums, num_classes), dim=1)


def _grow(sums: torch.Tensor, rows: int) -> torch.Tensor:
    """``sums`` with zero rows appended up to ``rows`` rows."""
    if sums.shape[0] >= rows:
        return sums
    return torch.cat([sums, sums.new_zeros(rows - sums.shape[0], sums.shape[1])])


def _add_per_class(sums: Optional[torch.Tensor], vectors: torch.Tensor, labels: torch.Tensor,
                   num_classes: int) -> torch.Tensor:
    """``sums [K, D]`` plus the ``vectors [n, D]`` added to their class's row (grown to ``K``)."""
    if sums is None:
        sums = vectors.new_zeros(num_classes, vectors.shape[1])
    return _grow(sums, num_classes).index_add_(0, labels, vectors)


class _CaptureTokens:
    """Forward hook on the feature module (:func:`feature_module`): leaves its output (tokens,
    or a map on a conv hybrid) in the context's extras.

    An object, not a closure, so ``copy.deepcopy`` of the model gives the copy's hook the copy's
    context."""

    def __init__(self, key: str, context: Any, channels_last: bool = False) -> None:
        self.key = key
        self.context = context
        self.channels_last = channels_last

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:  # type: ignore[type-arg]
        self.context.extras[self.key] = out.permute(0, 3, 1, 2) if self.channels_last else out


def feature_module(model: nn.Module) -> nn.Module:
    """The module whose output the retraining's IB bound reads: a ViT's last block (tokens) or,
    on a backbone without ``blocks``, its last stage (a map: EfficientViT's and MobileViT's
    ``stages``, Swin's ``layers``, whose ``[B, H, W, C]`` output :func:`channels_last` flags)."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None:
        return blocks[-1]
    stages = getattr(model, "stages", None)
    return stages[-1] if stages is not None else model.layers[-1]


def channels_last(model: nn.Module) -> bool:
    """Whether the feature module's map is ``[B, H, W, C]`` (timm's ``output_fmt`` NHWC: Swin)."""
    return getattr(model, "blocks", None) is None and getattr(model, "output_fmt", "NCHW") == "NHWC"


def _pooled(out: torch.Tensor, prefix: int, size: Optional[torch.Tensor]) -> torch.Tensor:
    """``[B, C]`` features of the feature module's output: the size-weighted patch-token mean
    (:func:`token_features`) or, for a map ``[B, C, H, W]``, its spatial mean."""
    return out.mean(dim=(2, 3)) if out.dim() == 4 else token_features(out, prefix, size)


def _final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """:func:`vitbench.measure.ib.final_features` on a ViT; the last stage's pooled map on a
    conv hybrid (the same features the bound is trained on, see :func:`_pooled`)."""
    if getattr(model, "blocks", None) is not None:
        return final_features(model, images)
    captured = SimpleNamespace(extras={})
    handle = feature_module(model).register_forward_hook(_CaptureTokens("out", captured, channels_last(model)))
    try:
        model(images)
    finally:
        handle.remove()
    return _pooled(captured.extras["out"], 0, None)


class DCSReducer(nn.Module):
    """One block's DCS channel selection: Q/K masks, MLP channel gate, temperature.

    The token step (``forward``) returns ``x`` unchanged; :meth:`qk` and :meth:`mlp_forward` are
    the block's channel hooks. Submodules: ``qk_mask`` (``arch`` both|qk), ``mlp_gate`` (``arch``
    both|out, until the shrink), ``ib`` (the last block only, when the retraining uses the IB
    bound); buffers ``tau`` and, after the shrink, ``kept``.

    Its part of the compute budget (:mod:`vitbench.engine.channel_budget`): the MLP's ``fc1`` and
    ``fc2`` (``2 * N * H`` MACs per kept channel, ``N`` tokens per image, ``H`` hidden width)
    and the Q/K mask Linear(s) (``N * C * C`` each); the rest of the block is counted as fixed.
    """

    needs: frozenset[str] = frozenset()

    def __init__(self, dim: int, num_heads: int, arch: str, separate: bool, tau0: float) -> None:
        super().__init__()
        self.channels = dim
        self.register_buffer("tau", torch.tensor(float(tau0)))
        self.register_buffer("kept", None)
        self.qk_mask = QKChannelMask(dim, num_heads, dim // num_heads, separate) if arch != "out" else None
        self.mlp_gate = ChannelGate(dim) if arch != "qk" else None
        self.ib: Optional[IBStatistics] = None
        self._last_shape: Optional[tuple[int, int]] = None  # (tokens in the batch, hidden) of the last forward
        self.cost_shape: Optional[tuple[int, int]] = None  # the same per image, fixed by the budget's count

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        return x

    def qk(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask the per-head queries and keys ``[B, h, N, d]`` (identity without ``qk_mask``)."""
        if self.qk_mask is None:
            return q, k
        return self.qk_mask(q, k, x, self.tau)

    def mlp_forward(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The block's MLP on the normed tokens: gated in the search, sparse after the shrink."""
        tokens = x.numel() // x.shape[-1]
        if self.kept is not None:
            self._last_shape = (tokens, mlp.fc1.out_features)
            return sparse_mlp(mlp, x, self.kept)
        if self.mlp_gate is None:
            self._last_shape = (tokens, 0)
            return mlp(x)
        check_mlp(mlp)  # fail in the first forward, not after a whole search epoch
        self._last_shape = (tokens, mlp.fc1.out_features)
        return gated_mlp(mlp, x, self.mlp_gate(self.tau))

    # -- the compute budget (vitbench.engine.channel_budget) --------------------------------

    def snapshot_shape(self) -> None:
        """Fix the last forward's shapes (a batch-1 count) as the ones the costs are for."""
        if self._last_shape is None:
            raise RuntimeError("dcs: no forward has run through this block's MLP yet")
        self.cost_shape = self._last_shape

    def hard_decision(self) -> Optional[torch.Tensor]:
        """The search's keep/drop decision ``alpha > 0`` as 0/1 ``[C]`` (``None`` without a gate)."""
        return None if self.mlp_gate is None else (self.mlp_gate.alpha.detach() > 0).float()

    def decision(self) -> Optional[torch.Tensor]:
        """:meth:`hard_decision` with the straight-through gradient of ``sigmoid(alpha / tau)``."""
        return None if self.mlp_gate is None else self.mlp_gate.decision(self.tau)

    def alpha_values(self) -> torch.Tensor:
        return self.mlp_gate.alpha.detach()

    def budget_units(self) -> list[tuple[float, torch.Tensor]]:
        """What the budget drops when the search kept too much: single channels, lowest
        ``alpha`` first."""
        return [(float(a), torch.tensor([c])) for c, a in enumerate(self.mlp_gate.alpha.detach().tolist())]

    def _mask_macs(self, tokens: int) -> int:
        if self.qk_mask is None:
            return 0
        return tokens * sum(m.in_features * m.out_features for m in self.qk_mask.modules() if isinstance(m, nn.Linear))

    def block_macs(self, keep: Optional[torch.Tensor]) -> torch.Tensor | float:
        """MACs per image of the MLP (gated or shrunk; ``fc1`` reads and ``fc2`` writes each kept
        channel: ``2 * N * H`` per channel) and of the Q/K mask Linears (``N * C * C`` each), at
        the decision ``keep [C]`` or (``None``) as the block is now. With ``arch=qk`` the MLP is
        not the method's and is left to the counted fixed part."""
        if self.cost_shape is None:
            raise RuntimeError("dcs: the compute budget has not been measured (ComputeBudget.measure)")
        tokens, hidden = self.cost_shape
        mask = self._mask_macs(tokens)
        if keep is not None:
            return 2 * tokens * hidden * keep.sum() + mask
        if self.kept is not None:
            return float(2 * tokens * hidden * self.kept.numel() + mask)
        if self.mlp_gate is not None:
            return float(2 * tokens * hidden * self.channels + mask)
        return float(mask)

    def baseline_macs(self) -> float:
        """The unpatched block's part that :meth:`block_macs` models: the whole MLP (if gated)."""
        tokens, hidden = self.cost_shape or (0, 0)
        return float(2 * tokens * hidden * self.channels) if self.mlp_gate is not None or self.kept is not None else 0.0

    @property
    def alpha_count(self) -> int:
        return 0 if self.mlp_gate is None else self.mlp_gate.alpha.numel()

    def shrink(self, mlp: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """Fix the architecture: keep the channels ``index`` (default ``alpha > 0``), shrink
        ``mlp`` to them and drop the gate. Does nothing without a gate (``arch=qk``)."""
        if self.mlp_gate is None:
            return
        if index is None:
            index = self.mlp_gate.kept_index()
        shrink_mlp(mlp, index)
        self.kept = index.to(device=self.tau.device, dtype=torch.long)
        self.mlp_gate = None

    def shrink_block(self, block: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """:meth:`shrink` on the MLP of ``block`` (the timm ``Block`` a ReducingBlock wraps)."""
        self.shrink(block.mlp, index)


class DCSLiteMLAReducer(nn.Module):
    """One EfficientViT LiteMLA's DCS channel selection (docs/methods.md §7 on EfficientViT: "Q/K of
    each LiteMLA branch, and the concatenated branch outputs feeding the projection").

    The hooks are those of :mod:`vitbench.engine.families.efficientvit`:

    - ``qk_mask`` (``arch`` both|qk): ``theta = Linear(x)`` from the LiteMLA's input map (each
      position a token, ``C`` channels) to one logit per query/key channel of every branch and
      head (``BRANCHES * C``), the same straight-through Gumbel mask as on a ViT, applied to the
      ReLU-kernel features ``phi(Q)``, ``phi(K)`` (:meth:`qk`);
    - ``out_gate`` (``arch`` both|out): architecture logits ``alpha`` over the ``BRANCHES * C``
      concatenated branch outputs; :meth:`proj_forward` runs ``proj(out * g)``.

    :meth:`shrink` (after the search) keeps the channels with ``alpha > 0``: ``proj.conv`` reads
    only those (a :class:`~vitbench.engine.channel_select.PointwiseConv` under the same name),
    ``kept`` holds their indices, ``heads_used`` the heads with at least one kept channel --
    only those heads' attention (their q, k, v) runs, and the Q/K mask's Linear keeps only
    their rows. Within a kept head all ``d`` value channels are computed (the head's ``k^T v``
    product is ``[d, d+1]`` either way); the ``qkv`` and aggregation convolutions keep every
    channel, because the 5x5 branch's grouped 1x1 conv mixes all ``d`` channels of a head of
    the 1x1 branch, so timm's shapes stay and only ``proj`` changes shape in the state dict.
    """

    needs: frozenset[str] = frozenset()

    def __init__(self, in_channels: int, num_heads: int, head_dim: int, arch: str, separate: bool,
                 tau0: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.in_channels = in_channels
        self.num_heads = num_heads  # every head of every branch (H')
        self.total_channels = num_heads * head_dim
        self.register_buffer("tau", torch.tensor(float(tau0)))
        self.register_buffer("kept", None)
        self.register_buffer("heads_used", None, persistent=False)  # derived from ``kept``
        self.register_buffer("kept_positions", None, persistent=False)
        self.register_buffer("pairs_used", None, persistent=False)
        self.register_buffer("head_positions", None, persistent=False)
        self.pair_macs_per_position: Optional[int] = None  # set by the first forward (observe)
        self.qk_mask = QKChannelMask(in_channels, num_heads, head_dim, separate) if arch != "out" else None
        self.out_gate = ChannelGate(num_heads * head_dim) if arch != "qk" else None
        self.ib: Optional[IBStatistics] = None
        self._last_shape: Optional[tuple[int, int]] = None  # (HW, proj's C_out) of the last forward
        self.cost_shape: Optional[tuple[int, int]] = None  # fixed by the budget's batch-1 count

    def qk(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask the kernel features ``[B, H', HW, d]`` of the computed heads (identity without
        ``qk_mask``); ``x [B, HW, C]`` the LiteMLA's input positions."""
        if self.qk_mask is None:
            return q, k
        return self.qk_mask(q, k, x, self.tau)

    def proj_forward(self, proj: nn.Module, out: torch.Tensor) -> torch.Tensor:
        """``proj`` on the concatenated branch outputs ``[B, H'*d, H, W]``: gated in the search,
        reading only the kept channels after the shrink."""
        self._last_shape = (out.shape[-2] * out.shape[-1], proj.conv.out_channels)
        if self.kept is not None:
            return proj(out.index_select(1, self.kept_positions))
        if self.out_gate is None:
            return proj(out)
        check_pointwise_proj(proj)  # fail in the first forward, not after a whole search epoch
        return proj(out * self.out_gate(self.tau).to(out.dtype)[:, None, None])

    # -- the compute budget (vitbench.engine.channel_budget) --------------------------------

    def snapshot_shape(self) -> None:
        """Fix the last forward's shapes (a batch-1 count) as the ones the costs are for."""
        if self._last_shape is None:
            raise RuntimeError("dcs: no forward has run through this LiteMLA yet")
        self.cost_shape = self._last_shape

    def hard_decision(self) -> Optional[torch.Tensor]:
        """The search's keep/drop decision ``alpha > 0`` as 0/1 ``[H'*d]`` (``None`` without a gate)."""
        return None if self.out_gate is None else (self.out_gate.alpha.detach() > 0).float()

    def decision(self) -> Optional[torch.Tensor]:
        """:meth:`hard_decision` with the straight-through gradient of ``sigmoid(alpha / tau)``."""
        return None if self.out_gate is None else self.out_gate.decision(self.tau)

    def alpha_values(self) -> torch.Tensor:
        return self.out_gate.alpha.detach()

    def observe(self, mla: nn.Module, x: torch.Tensor) -> None:
        """Every forward: on the first (the module still whole), check that the ``qkv`` and
        aggregation convolutions can drop a head pair and record what a pair costs per
        position (:meth:`_pair_macs`)."""
        if self.pair_macs_per_position is not None or self.out_gate is None:
            return
        from timm.models.efficientvit_mit import LiteMLA

        qkv, d = mla.qkv, self.head_dim
        plain = (type(mla) is LiteMLA and type(qkv.conv) is nn.Conv2d and qkv.conv.groups == 1
                 and isinstance(qkv.norm, nn.Identity) and isinstance(qkv.act, nn.Identity)
                 and all(isinstance(op, nn.Sequential) and len(op) == 2
                         and all(type(c) is nn.Conv2d for c in op) for op in mla.aggreg))
        if not plain:
            raise UnsupportedError("DCS on EfficientViT needs timm's LiteMLA with a plain 1x1 qkv conv "
                                   "(no norm/activation) and (depthwise, grouped 1x1) aggregation convs; "
                                   "use arch=qk (Q/K channel masks only) for this model")
        per_pair = qkv.conv.in_channels * 3 * d
        for dw, pw in mla.aggreg:
            per_pair += 3 * d * (dw.kernel_size[0] * dw.kernel_size[1] + pw.in_channels // pw.groups)
        self.pair_macs_per_position = per_pair

    def _head_macs(self, hw: int) -> int:
        """MACs per image of one computed head: its linear attention ``k^T [v 1]`` and ``q (k^T
        [v 1])`` (``2 * HW * d * (d + 1)``) and its rows of the Q/K mask Linear(s) (``HW * C * d``
        each)."""
        d = self.head_dim
        mask = 0 if self.qk_mask is None else hw * self.in_channels * d * (2 if self.qk_mask.separate else 1)
        return 2 * hw * d * (d + 1) + mask

    def _pair_macs(self, hw: int) -> int:
        """MACs per image of one head pair's q/k/v: ``3d`` rows of the 1x1 ``qkv`` conv and the
        same channels of each aggregation (depthwise ``k x k``, then grouped 1x1 over ``d``)."""
        if self.pair_macs_per_position is None:
            raise RuntimeError("dcs: no forward has run through this LiteMLA yet")
        return hw * self.pair_macs_per_position

    def block_macs(self, keep: Optional[torch.Tensor]) -> torch.Tensor | float:
        """MACs per image of what DCS changes in this LiteMLA, at the decision ``keep [H'*d]`` or
        (``None``) as the block is now: ``proj`` (``HW * C_out`` per kept input channel), the
        attention of every head with a kept output channel and its Q/K mask rows
        (:meth:`_head_macs`), and the q/k/v convolutions of every head pair with a kept head
        (:meth:`_pair_macs`). With ``arch=qk`` only the mask is the method's (every head runs,
        proj is whole). Only the ``proj`` term carries the straight-through gradient; heads and
        pairs are counted hard."""
        if self.cost_shape is None:
            raise RuntimeError("dcs: the compute budget has not been measured (ComputeBudget.measure)")
        hw, c_out = self.cost_shape
        if keep is not None:
            used = keep.detach().view(-1, self.head_dim).sum(1) > 0
            half = self.num_heads // 2
            heads, pairs = int(used.sum()), int((used[:half] | used[half:]).sum())
            return hw * c_out * keep.sum() + heads * self._head_macs(hw) + pairs * self._pair_macs(hw)
        if self.kept is not None:
            return float(hw * c_out * self.kept.numel() + self.heads_used.numel() * self._head_macs(hw)
                         + self.pairs_used.numel() * self._pair_macs(hw))
        if self.out_gate is not None:
            return float(hw * c_out * self.total_channels + self.num_heads * self._head_macs(hw)
                         + self.num_heads // 2 * self._pair_macs(hw))
        return float(self.num_heads * (self._head_macs(hw) - 2 * hw * self.head_dim * (self.head_dim + 1)))

    def baseline_macs(self) -> float:
        """The unpatched LiteMLA's part that :meth:`block_macs` models (if gated): ``proj``,
        every head's attention, every pair's q/k/v convolutions."""
        if self.cost_shape is None or (self.out_gate is None and self.kept is None):
            return 0.0
        hw, c_out = self.cost_shape
        d = self.head_dim
        return float(hw * c_out * self.total_channels + self.num_heads * 2 * hw * d * (d + 1)
                     + self.num_heads // 2 * self._pair_macs(hw))

    def budget_units(self) -> list[tuple[float, torch.Tensor]]:
        """What the budget drops when the search kept too much: whole head pairs (the ``2d``
        output channels of a 1x1-branch head and of the 5x5-branch head computed from its q/k/v;
        dropping both frees the pair's ``qkv`` and aggregation rows too, 2.5x what its ``proj``
        columns alone save), least important first by the mean ``alpha`` of their channels."""
        d, half = self.head_dim, self.num_heads // 2
        alpha = self.out_gate.alpha.detach().view(self.num_heads, d)
        units = []
        for t in range(half):
            channels = torch.cat([torch.arange(t * d, (t + 1) * d), torch.arange((t + half) * d, (t + half + 1) * d)])
            units.append((float(torch.cat([alpha[t], alpha[t + half]]).mean()), channels))
        return units

    @property
    def alpha_count(self) -> int:
        return 0 if self.out_gate is None else self.out_gate.alpha.numel()

    def shrink(self, mla: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """Fix the architecture: keep the output channels ``index`` (default ``alpha > 0``),
        shrink ``proj``, the q/k/v convolutions and the Q/K mask to them (class docstring) and
        drop the gate. Does nothing without a gate (``arch=qk``)."""
        if self.out_gate is None:
            return
        if index is None:
            index = self.out_gate.kept_index()
        index = index.to(device=self.tau.device, dtype=torch.long)
        d, half = self.head_dim, self.num_heads // 2
        shrink_proj_input(mla.proj, index)
        heads = torch.unique(index // d)  # sorted
        pairs = torch.unique(heads % half)
        rows = (pairs[:, None] * 3 * d + torch.arange(3 * d, device=pairs.device)).flatten()
        mla.qkv.conv = conv_output_channels(mla.qkv.conv, rows)
        for op in mla.aggreg:  # their inputs become the kept qkv rows, in order
            op[0] = conv_output_channels(op[0], rows)
            op[1] = conv_output_channels(op[1], rows)
        if self.qk_mask is not None:
            shrink_qk_mask(self.qk_mask, heads)
        computed = torch.cat([pairs, pairs + half])  # heads the shrunk convs compute, in order
        self.kept = index
        self.heads_used = heads
        self.pairs_used = pairs
        self.head_positions = torch.searchsorted(computed, heads)
        self.kept_positions = torch.searchsorted(heads, index // d) * d + index % d
        self.out_gate = None

    def shrink_block(self, block: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """:meth:`shrink` on ``block`` (the LiteMLA a ReducingLiteMLA wraps)."""
        self.shrink(block, index)


# -- finding the method's modules in a patched model --------------------------------------------

_REDUCERS = (DCSReducer, DCSLiteMLAReducer)


def _blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module, Any]]:
    """``(name, wrapper, reducer)`` of every block wrapper (a ViT/MobileViT ReducingBlock, an
    EfficientViT ReducingLiteMLA) holding a DCS reducer, in forward order."""
    for name, module in model.named_modules():
        if isinstance(getattr(module, "reducer", None), _REDUCERS):
            yield name, module, module.reducer


def dcs_reducers(model: nn.Module) -> list[Any]:
    """The DCS reducers of a patched model, in block order."""
    return [reducer for _, _, reducer in _blocks(model)]


def _ib_statistics(model: nn.Module) -> Optional[IBStatistics]:
    return next((r.ib for r in dcs_reducers(model) if r.ib is not None), None)


# -- search -----------------------------------------------------------------------------------

def decay_tau(tau_decay: float) -> Callable[[nn.Module, int, Callable[[], Any]], None]:
    """``epoch_end`` callback: multiply every block's ``tau`` by ``tau_decay``."""
    def callback(model: nn.Module, epoch: int, batches: Callable[[], Any]) -> None:
        for reducer in dcs_reducers(model):
            reducer.tau.mul_(tau_decay)
    return callback


def _measured(model: nn.Module, budget: float, image: Optional[torch.Tensor] = None) -> ComputeBudget:
    """The model's :class:`~vitbench.engine.channel_budget.ComputeBudget`, counted once (on
    ``image``, else on the last forward's first input) and kept on the first reducer."""
    reducers = dcs_reducers(model)
    cost = getattr(reducers[0], "compute_budget", None)
    if cost is None:
        if image is None:
            ctx = reduction_context(model)
            image = None if ctx is None else ctx.inputs
        if image is None:
            raise RuntimeError("dcs: the compute budget is counted on a training image; run the search "
                               "stage's `before` callback or a forward first")
        cost = ComputeBudget.measure(model, image[:1].detach(), reducers, budget)
        reducers[0].compute_budget = cost
    return cost


def measure_budget(budget: float) -> Callable[[nn.Module, Callable[[], Any]], None]:
    """``before`` callback of the search: count the model once at batch 1 on the first training
    image and build the cost model (:func:`_measured`); a budget the model cannot reach fails
    here, before any training."""
    def callback(model: nn.Module, batches: Callable[[], Any]) -> None:
        images, _ = next(iter(batches()))
        _measured(model, budget, images[:1])
    return callback


def search_loss(budget: float, lam: float) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]:
    """``extra_loss`` of the search: ``lam * max(0, log(cost / (budget * baseline)))``.

    ``cost`` is the counted-GMACs model of the whole network (:mod:`vitbench.engine.channel_budget`)
    at the hard decision ``alpha > 0`` -- the architecture the shrink would keep now, Q/K mask
    Linears included -- with the straight-through gradient of ``sigmoid(alpha / tau)``. Zero
    once the decision fits the budget, so the cross-entropy alone ranks the channels there."""
    def extra_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        if lam == 0:
            return None
        reducers = dcs_reducers(model)
        cost = _measured(model, budget)
        macs = cost.macs(reducers, [r.decision() for r in reducers])
        return lam * torch.clamp(torch.log(macs / cost.target), min=0.0)
    return extra_loss


def shrink_to_budget(budget: float) -> Callable[[nn.Module], None]:
    """``after`` callback of the search: the hard decision ``alpha > 0``, made to fit the budget
    by dropping the lowest-``alpha`` kept channels (:func:`~vitbench.engine.channel_budget.
    enforce_budget`, logged), then every gated MLP (or LiteMLA projection) shrinks to it."""
    def callback(model: nn.Module) -> None:
        blocks = list(_blocks(model))
        if all(r.hard_decision() is None for _, _, r in blocks):
            return
        result = enforce_budget(_measured(model, budget), [r for _, _, r in blocks])
        for (_, block, reducer), keep in zip(blocks, result.keep):
            if keep is not None:
                reducer.shrink_block(block.block, keep.nonzero().flatten())
        blocks[0][2].budget_result = result
    return callback


# -- retraining with the IB bound ---------------------------------------------------------------

def _ib_active(ib: IBStatistics, t_warm: int) -> bool:
    return int(ib.epochs_done) >= t_warm


def ib_before(t_warm: int) -> Callable[[nn.Module, Callable[[], Any]], None]:
    """``before`` callback of the retraining: capture the final block's tokens in every forward
    and, if the bound is on from the first epoch, fill the statistics."""
    def callback(model: nn.Module, batches: Callable[[], Any]) -> None:
        ib = _ib_statistics(model)
        if ib is None:
            return
        last = feature_module(model)
        if not any(isinstance(h, _CaptureTokens) for h in last._forward_hooks.values()):
            last.register_forward_hook(_CaptureTokens(_TOKENS_KEY, reduction_context(model), channels_last(model)))
        if _ib_active(ib, t_warm):
            ib.refresh(model, batches)
    return callback


def ib_epoch_end(t_warm: int, epochs: int) -> Callable[[nn.Module, int, Callable[[], Any]], None]:
    """``epoch_end`` callback of the retraining: count the epoch; refresh the statistics when
    the next epoch uses the bound (nothing to refresh after the last of ``epochs``)."""
    def callback(model: nn.Module, epoch: int, batches: Callable[[], Any]) -> None:
        ib = _ib_statistics(model)
        if ib is None:
            return
        ib.epochs_done += 1
        if _ib_active(ib, t_warm) and int(ib.epochs_done) < epochs:
            ib.refresh(model, batches)
    return callback


def ib_after(model: nn.Module) -> None:
    """``after`` callback of the retraining: remove the token capture hook."""
    hooks = feature_module(model)._forward_hooks
    for key in [k for k, h in hooks.items() if isinstance(h, _CaptureTokens)]:
        del hooks[key]


def ib_loss(eta: float, t_warm: int) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]:
    """``extra_loss`` of the retraining: ``eta * IB bound`` of the final patch-token mean
    (docs/methods.md §6) once ``t_warm`` retraining epochs are done."""
    def extra_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        ib = _ib_statistics(model)
        ctx = reduction_context(model)
        if ib is None or ctx is None or not _ib_active(ib, t_warm):
            return None
        if not ib.ready:
            raise RuntimeError("dcs: the IB statistics are empty; the retrain stage's `before` "
                               "callback (the statistics pass) did not run")
        tokens = ctx.extras.get(_TOKENS_KEY)
        if tokens is None or ctx.inputs is None:
            raise RuntimeError("dcs: the forward left no final tokens or inputs; the retrain "
                               "stage's `before` callback did not run")
        size = ctx.state.size if ctx.state is not None else None
        tau_f = soft_assign(_pooled(tokens, ctx.prefix, size), ib.feature_centroids)
        tau_x = soft_assign(input_vectors(ctx.inputs), ib.input_centroids)
        return eta * ib_terms(tau_f, tau_x, labels, ib.log_q.shape[0], log_q=ib.log_q).bound
    return extra_loss


# -- loading a trained checkpoint ---------------------------------------------------------------

def prepare_load(model: nn.Module, state_dict: dict) -> None:
    """Shrink a freshly applied model to the widths saved in ``state_dict`` and give empty IB
    statistics the saved shapes, so ``model.load_state_dict(state_dict, strict=True)`` works.

    Keys may carry a prefix (a wrapper's ``backbone.``): a block's keys are found by suffix."""
    for name, block, reducer in _blocks(model):
        kept = _find(state_dict, f"{name}.reducer.kept")
        if kept is not None and reducer.kept is None:
            reducer.shrink_block(block.block, kept.to(torch.long))
        ib_name = f"{name}.reducer.ib."
        if reducer.ib is not None:
            for buffer, value in list(reducer.ib.named_buffers()):
                saved = _find(state_dict, ib_name + buffer)
                if saved is not None and saved.shape != value.shape:
                    setattr(reducer.ib, buffer, torch.empty(saved.shape, dtype=value.dtype, device=value.device))


def _find(state_dict: dict, key: str) -> Optional[torch.Tensor]:
    if key in state_dict:
        return state_dict[key]
    pattern = re.compile(r"(^|\.)" + re.escape(key) + "$")
    matches = [k for k in state_dict if pattern.search(k)]
    return state_dict[matches[0]] if len(matches) == 1 else None


# -- registration -----------------------------------------------------------------------------

def _reducers(params: DCSParams, info: ModelInfo) -> list[Any]:
    """One reducer per attention block, sized by ``info.blocks`` when the family fills it
    (hybrids: per-block widths) and by the scalar fields otherwise."""
    separate = params.qk_mask == "separate"
    if info.family == "efficientvit":
        from vitbench.engine.families.efficientvit import BRANCHES

        return [DCSLiteMLAReducer(b.dim, BRANCHES * b.num_heads, b.dim // b.num_heads, params.arch,
                                  separate, params.tau0) for b in info.blocks]
    shapes = [(b.dim, b.num_heads) for b in info.blocks] or [(info.embed_dim, info.num_heads)] * info.depth
    return [DCSReducer(dim, heads, params.arch, separate, params.tau0) for dim, heads in shapes]


def build(params: DCSParams, info: ModelInfo) -> Reduction:
    reducers = _reducers(params, info)
    if params.uses_ib:
        reducers[-1].ib = IBStatistics()
    for reducer in reducers:  # a new module trains; these start as inference (no Gumbel noise)
        reducer.eval()
    gated = params.arch != "qk"
    stages = [TrainStage(
        name="search",
        epochs=params.search_epochs,
        optimizer=params.optimizer,
        lr=params.lr,
        lr_groups=(("alpha", params.arch_lr),) if gated else (),
        arch_keys=("alpha",) if gated else (),
        arch_fraction=ARCH_FRACTION if gated else 0.0,
        batch_size=params.batch_size,
        extra_loss=search_loss(params.budget, params.lam) if gated else None,
        before=(measure_budget(params.budget),) if gated else (),
        epoch_end=(decay_tau(params.tau_decay),),
        after=(shrink_to_budget(params.budget),),
    )]
    if params.retrain_epochs > 0 and params.arch != "out":  # arch=out: nothing to retrain
        stages.append(TrainStage(
            name="retrain",
            epochs=params.retrain_epochs,
            optimizer=params.optimizer,
            lr=params.lr,
            batch_size=params.batch_size,
            trainable=("qk_mask",),
            extra_loss=ib_loss(params.eta, params.t_warm) if params.uses_ib else None,
            before=(ib_before(params.t_warm),) if params.uses_ib else (),
            epoch_end=(ib_epoch_end(params.t_warm, params.retrain_epochs),) if params.uses_ib else (),
            after=(ib_after,) if params.uses_ib else (),
        ))
    return Reduction(reducers, prop_attn=False, train=tuple(stages), prepare_load=prepare_load)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dcs",
        kind="channel",
        params=DCSParams,
        build=build,
        families=("vit", "efficientvit", "mobilevit", "swin"),
        needs_training=True,
        # the fraction of the baseline's GMACs to keep (enforced when the search ends): set to F
        budget=BudgetKnob("budget", larger_means="more", mode="fraction"),
        description="DCS: differentiable Q/K and MLP (EfficientViT: attention-output) channel "
                    "selection, searched then retrained with the IB bound (learnable)",
    ))
