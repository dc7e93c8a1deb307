"""LTM / IBTM: learnable token merging guided by the information bottleneck (docs/methods.md §5, §6).

IBTM (Information-Bottleneck Token Merging) and LTM (Learnable Token Merging) are the same
method; it is registered as ``ltm`` with the alias ``ibtm``. No public implementation exists
(the authors' repository holds only an IB training harness), so this module is the reference;
every choice the papers and docs/methods.md leave open is listed here.

What it does (docs/methods.md §5)
----------------------------
- **Shapes.** Block 1 (index 0) merges the ``N_p`` patch tokens once into
  ``P = ceil(ratio * N_p)`` tokens; every later block re-merges its ``P`` tokens into ``P``
  tokens, so all later masks have the same ``[P, P]`` shape (the papers' update
  ``G_l = G_{l-1} - eta * grad`` needs that) and the token count is constant after block 1, which
  is what the papers' GFLOPs (ViT-B 17.58 -> 12.85 at ratio 0.7) correspond to. Prefix tokens
  (cls, dist, registers) are kept aside, untouched, and stay first. Every merge happens after
  the attention residual and before the MLP (§0). P and its spatial grid ``(H', W')`` come
  from :data:`MERGE_GRIDS`, a replaceable per-family function ``(info, ratio) -> (P, (H', W'))``;
  the plain-ViT rule (:func:`vit_merge_grid`) is a ``ceil(sqrt(P))`` square grid.
- **Conv hybrids** (MobileViT, docs/methods.md §5 "Conv hybrids"; the family's ``ModelInfo.blocks``):
  everything above holds per token sequence (one per MobileViT block; the token state restarts
  at its first block): the first block of each sequence merges the ``H x W`` tokens it sees
  into ``P = H'W'``, ``H' = ceil(H sqrt(ratio))``, ``W'`` likewise (:func:`conv_merge_grid`),
  with its own :class:`FirstMerge`; its later blocks re-merge ``P -> P`` with their own widths.
  Every merge is declared a grid merge (:mod:`vitbench.engine.grid_merge`): the adapter folds
  the tokens to the ``2H' x 2W'`` map and merges the fusion shortcut with the same matrices,
  and the next stages run on the smaller map, so a later sequence sees fewer tokens than in
  the unreduced model (:data:`SEQUENCE_GRIDS`; mobilevit_xs at 256x256, ratio 0.7: 16x16 ->
  14x14, then 7x7 -> 6x6, then 3x3 stays; maps 28, 12, 6 instead of 32, 16, 8). The model is
  sized for the input size the adapter describes (``model.vitbench_input_size``, else the
  pretrained config's): another size is an error. Counted GMACs at 256x256, ratio 0.7,
  untrained: mobilevit_s 2.00 -> 1.71 (the papers: 1.40 -> 1.17 GFLOPs, a similar 16%),
  mobilevit_xs 1.03 -> 0.92.
- **Swin** (docs/methods.md §5 "On Swin"; the swin adapter reduces each block's tiles for the
  MLP only and unmerges after it, ToMe for SD §3): the residual stream keeps every token, so
  every block merges each ``t``-token tile afresh, with both steps of the method in one
  :class:`TileMerge`: its own first mask ``M1 [t, P]`` (``P = ceil(ratio * t)``, shared by the
  block's tiles, ``runs`` init by default), then the IB step of a later block on those ``P``
  tokens. The MLP output goes back through the soft sources (:meth:`TileMerge.unmerge`: each
  token gets its share-weighted mix of the merged tokens' outputs). Every tile is a sample of its
  image's class for the block's centroids and ``Q``; the IB bound's features are the mean of the
  last block's output map. Counted on a random-weight Swin-T: 4.49 -> 3.98 GMACs at ratio 0.7
  before statistics, 4.04 with 10 classes, 6.08 with 1000 (the paper: 3.82).
- **First mask** (:class:`FirstMerge`): ``x_merged = G1^T x`` per image with
  ``G1 = column-softmax((M1 + g) / tau)`` over the ``N_p`` inputs (each merged token is a convex
  combination of patches), ``M1 [N_p, P]`` learnable, ``g`` Gumbel noise drawn per image and
  entry in training only (inference: ``column-softmax(M1 / tau)``, deterministic).
- **Initialisation** (``init``). ``M1`` is 0 for the patches a merged token starts from and
  ``-12 * tau`` elsewhere, so ``M1 / tau`` is 0 / -12 for any ``tau``: each merged token starts
  as the plain mean of its patches, up to a leak of ``e^-12`` (6e-6) of weight per other patch;
  the other logits stay finite so that training can move weight (a prior, not a constraint).
  Which patches:

  - ``runs`` (the plain-ViT default, :func:`run_logits`): the least pooling that reaches ``P``
    tokens. A boustrophedon path through the patch grid (consecutive patches are neighbours)
    is cut into ``P`` contiguous runs of ``floor(N_p/P)`` or ``ceil(N_p/P)`` patches, the longer
    runs spread evenly; at ratio 0.7 on 8x8 patches, 19 pairs of neighbours and 26 single
    patches. Every patch belongs to exactly one merged token.
  - ``grid`` (the conv hybrids' only choice, whose merge must fold to an ``H' x W'`` map;
    selectable on ViT): average pooling to the ``ceil(sqrt(P))`` grid. Merged token ``p`` is
    cell ``cells[p]`` of an ``H' x W'`` grid laid over the patch grid with the windows of
    ``torch.nn.functional.adaptive_avg_pool2d`` (rows ``floor(i*H/H') .. ceil((i+1)*H/H')``,
    columns likewise; windows may overlap); when ``H'W' > P`` the ``P`` cells are spread evenly
    in raster order, ``cells = floor(linspace(0, H'W'-1, P) + 0.5)``.

  Why ``runs`` on ViT (a deviation from docs/methods.md §5's "average pooling to a
  ``ceil(sqrt(P))`` grid", measured on the default model, top-1 on 2000 test images, baseline
  81.3 %): 8 -> 7 pooling windows are 2 patches wide, so the grid init blurs *every* token over
  four patches and skips 4 of the 49 cells; the frozen backbone then reads 24.4 % untrained and
  65-74 % after the default fine-tuning. The runs init leaves 26 of 45 tokens untouched: 72.5 %
  untrained, 79-80 % fine-tuned. ``ratio = 1`` gives the identity with either init.
- **Later blocks** (:class:`ReMerge`): one gradient step on the IB bound from "keep every
  token" (:func:`ib_mask_step`),
  ``G~ = I - 2 eta sum_a X~ (S_a / gamma^2) (gamma C_a - zeta)^T psi_a`` with ``Z`` the patch
  tokens entering the merge, ``X~ = MLP_l(Z) [P, C]``, ``C_a [P, C]`` the class-a centroid of
  ``X~``, ``S_a = exp(-dist(X~, C_a))``, ``gamma = sum_a S_a``, ``zeta = sum_a S_a C_a``, and
  ``dist`` the *mean* squared distance (squared Frobenius norm / (P*C); docs/methods.md's
  documented deviation from the raw squared norm, so that the softmax does not saturate). Then
  ``G_l = column-softmax(s_l * G~)`` over the entries the binary Gumbel mask ``M_l`` keeps,
  and ``x_merged = G_l^T Z``. ``G~ [p, q] = delta_pq - 2 eta X~_p . V_q`` (rows: inputs,
  columns: merged tokens).
- **The per-block MLP** ``MLP_l``: ``LayerNorm(C) -> Linear(C, h) -> GELU -> Linear(h, C)``,
  ``h = round(mlp_ratio * C)`` (default ``C/4``: 16 for width 64, 192 for ViT-B), PyTorch's
  default init. The LayerNorm (our choice) makes the IB step independent of the scale of the
  residual stream (ViT-B's has large outlier channels). The MLP only drives the mask; the
  tokens merged are ``Z`` itself.
- **The binary mask** ``M_l``: logits ``[P, P]`` initialised to +3 (keep all),
  ``soft = sigmoid((logits + g1 - g2) / tau)`` with Gumbel noise ``g1, g2`` per image in
  training (none at inference), forward ``hard = soft > 0.5``, straight-through gradient
  through ``soft`` (as LTMP's and DCS's maskers). At +3 an entry is dropped by the training
  noise with probability 5%; the gradient ``sigmoid'(3) = 0.045`` is not vanishing. The
  diagonal is always kept (a token may always keep itself), so no column is empty; the
  diagonal logits therefore get no gradient.
- **The logit scale** ``s_l``: a learnable scalar initialised to ``ln(99 (P-1))``, so that
  with ``G~ = I`` each merged token is 99% itself and 1% the others: an untrained block does
  not mix (``G ~ I``). Not more: the gradients reaching ``s_l``, ``M_l`` and the MLP scale with
  the off-diagonal mass of the saturated softmax (at 99.9% they come down to AdamW's ``eps``,
  1e-8 per element, on the tiny test model).

Labels and the statistics
-------------------------
- ``psi_a = sum_b tau(X,b) log tau(X,b) - log Q(a|y)``. At inference the label is unknown, so
  ``log Q(a|y)`` is replaced by its expectation under the class prior,
  ``sum_y pi_y log Q(a|y)`` (the step stays input-dependent through ``tau``, and
  deterministic). **Training uses the same expectation by default** (``step_labels="prior"``):
  with the true label (``step_labels="true"``, the papers' literal reading, selectable) the
  merge of every later block is computed from the label, so the forward the loss trains sees
  the answer while the evaluated one cannot. Measured on the default model (top-1 on 2000 test
  images; baseline 81.3 %): the training CE fell to ~0.6 while test top-1 *dropped* with more
  training, 74 % -> 49 % from one to two epochs; with ``"prior"`` training and evaluation run
  the same forward and one epoch reaches 79-80 %.
- **The input term cancels.** Since ``sum_a (S_a/gamma^2)(gamma C_a - zeta) = 0`` (with
  ``tau_a = S_a/gamma``: ``sum_a tau_a (C_a - zeta/gamma) = 0``), any part of ``psi_a`` that does
  not depend on ``a`` drops out of ``G~`` exactly; ``sum_b tau(X,b) log tau(X,b)`` is such a
  part. :func:`ib_mask_step` therefore uses ``psi_a = -log Q(a|y)`` (its test checks equality
  with the literal formula, input term included). The input clusters still matter for the IB
  *bound* (the training loss below), so their centroids are kept as a buffer -- once, in the
  first block's module, since they are the same for every block.
- ``tau`` inside a block is ``softmax_a(-dist(X~, C_a))`` (``= S_a / gamma``, computed as a
  softmax for stability); ``Q(a|y)`` is the mean of that ``tau`` over the samples of class
  ``y`` (clamped at 1e-12, uniform for a class without samples, as
  :func:`vitbench.measure.ib.log_q_given_y`); a class without samples has a zero centroid.
- **Algorithm 1.** The centroids and ``Q`` are buffers, refreshed by
  :func:`refresh_statistics`: once before the first epoch (``TrainStage.before``) and after
  every epoch but the last (``TrainStage.epoch_end``; a refresh after the last epoch would
  change the forward the masks were trained with), so a checkpoint is self-contained. The refresh runs
  in eval mode, without gradients, over the first ``stats_images`` training images (0: all of
  them), in two passes: the first computes the new centroids, the second ``Q`` against them;
  both forwards use the previous statistics (they change only at the end), so the new
  statistics describe exactly the forward that produced them, one refresh behind, as
  Algorithm 1's per-epoch lag. Default 2048 images (about 200 per class on the 10-class
  default: enough for the centroids; the four passes of one stage take ~15 s on 2 CPU cores
  for the default model, next to ~1 min for its training epoch); for ImageNet use a few
  images per class at least, or 0.
- Before any refresh the buffers are empty (shape ``[0, ...]``: the number of classes,
  ``model.num_classes``, is only known from the model) and ``G~ = I``. A checkpoint therefore
  loads through ``Reduction.prepare_load``, which sizes the buffers like the saved ones.
- **Hybrids**: each of an image's token sequences (MobileViT: ``B*4`` of them) is a sample of
  the image's class for a block's centroids and ``Q`` (its label reaches all of them), and the
  final features (IB bound) are the size-weighted mean over all sequences of the image, taken
  at the last reducing block (:func:`final_features`, the hybrid-aware twin of
  :func:`vitbench.measure.ib.final_features`). The bound's statistics live in the first
  sequence's :class:`FirstMerge`; the other sequences' keep empty buffers.
- **Memory**: per later block ``K x P x C`` floats of centroids (plus ``K x K`` for ``Q``):
  10 classes x 45 x 64 = 29k floats on the default model; ImageNet ViT-S (1000 x 138 x 384)
  about 200 MB per block, ViT-B about 400 MB per block.
- **Compute**: per later block and image ``2 K P C`` MACs for the distances and ``V``,
  ``2 P^2 C`` for ``G~`` and the merge, ``2 P C h`` for the MLP. Counted
  (:func:`vitbench.measure.count_gmacs`): ViT-B/16 17.56 -> 13.07 GMACs before any statistics
  (the ~12.4 of the merged backbone plus the first merge and the MLPs), 13.26 with 10-class
  statistics; ImageNet's ``K = 1000`` adds ~2.3 GMACs more (0.28 GMACs per later block in
  all), more than the papers' 12.85 GFLOPs leave room for -- the formula as specified has no
  cheaper exact form. The 10-class default model: 44.9 -> 35.7 MMACs.

Sizes and sources
-----------------
A soft merge must say how many patches a merged token stands for. We keep the meaning of
``size`` (docs/methods.md §0, ToMe): each input token hands out its size to the merged tokens in
proportion to its row of ``G`` (``share = G / row-sum(G)``), so
``size_q = sum_i share_iq size_i``, the sizes of the patch tokens keep summing to ``N_p``, and a
hard ToMe-like merge gives ToMe's sizes. (The literal "column weights times the input sizes",
``G^T size``, is a convex combination whose total is ``P``, not ``N_p``, since each column of G
sums to 1.) The same shares update ``source`` when tracing (``source_q = sum_i share_iq
source_i``: rows sum to the size, each original patch's column sums to 1); these soft sources
are weights, so :func:`vitbench.engine.unmerge.unmerge` (which binarises coverage) does not
apply to LTM. Proportional attention (``log size``) and size-weighted pooling use these sizes.

The shares are bookkeeping and carry **no gradient** (``G`` is detached in them; the merged
tokens ``G^T x`` keep theirs). ``d share / d G`` is ``1 / row-sum``, and a token that every
merged token has learned to ignore has a row sum near 0: with the gradient flowing through the
shares, single steps of the default fine-tuning gave the ``M_l`` logits gradients of 1e18-1e31,
and one that overflowed to inf turned AdamW's moments and then the weights into NaN -- the
divergence behind a 0.00 % LTM row (it depended on the machine through float rounding: one run
on 2 threads failed at iteration 41, another did not). ToMe's sizes carry no gradient either.

Training (the papers' fine-tuning setup, Table 1)
-------------------------------------------------
One :class:`~vitbench.catalog.TrainStage`: the backbone is frozen (the loop trains only the
reducers' parameters): ``M1``, the ``M_l`` logits and the scales ``s_l`` (``lr`` 0.3); the
per-block MLPs of the IB step stay frozen at their initialisation unless ``mlp_lr > 0`` (a
documented deviation from the papers, which train them: a trained MLP moves ``X~`` away from the
centroids of the last statistics pass, and the step then mixes tokens by stale clusters; on the
default model that made the outcome chaotic, 69.8-79.6 % across seeds and threads at
``mlp_lr = lr``, 36-55 % with the MLPs, masks and scales all at 0.01, against 78.6-79.2 % frozen), with AdamW (no weight decay: decay would pull the mask logits towards "undecided"),
cosine schedule, two epochs (the statistics are refreshed between epochs, not after the last,
so the evaluated model runs the statistics it was trained against), and the loss ``CE + ib_weight * IB bound``. The bound (Theorem 3.1, §6) is computed by
:mod:`vitbench.measure.ib` on the final block's output features (size-weighted mean of its
patch tokens, exactly :func:`vitbench.measure.ib.final_features`, so the training term and the
reported metric are the same quantity), with the feature centroids, input centroids and
``log Q`` from the previous refresh (buffers of the first block's module). The features reach
``extra_loss`` through ``ctx.extras["ltm_features"]``, written by a forward hook on the last
block (the reducer runs before the last MLP, so it cannot see the block output); the hook is
registered by the ``before`` callback and removed by the ``after`` callback.
``ib_weight = 1`` (default): docs/methods.md gives no weight for LTM's fine-tuning, so the bound
enters with unit weight, on the scale of the CE (the DCS paper's ``eta = 50`` belongs to its
own retraining phase); 0 trains with CE only. The train-from-scratch setup (everything trains, merging after ``t_warm`` epochs) is not
provided here; ``--train-backbone`` gives the joint fine-tuning.

The reducers are created in eval mode (deterministic, like the eval-mode models vitbench
reduces); ``model.train()`` turns the Gumbel noise on. Each module holds a reference to a small
shared object (not in the state dict) through which the callbacks and ``prepare_load`` give the
later blocks the reduction context (its ``labels`` in training) and collect ``X~`` during a
statistics pass; reducers are built before the model's context exists, so they cannot capture
it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.catalog import MethodSpec, ModelInfo, Reduction, TrainStage
from vitbench.engine import AttnInfo, ReducingBlock, TokenState, reduction_context
from vitbench.engine.families.mobilevit import (
    sequence_grids as mobilevit_sequence_grids,
)
from vitbench.engine.families.swin import SwinReducingBlock
from vitbench.engine.grid_merge import record_grid_merge
from vitbench.engine.masks import straight_through_mask
from vitbench.errors import ParamError, UnsupportedError
from vitbench.hookspecs import hookimpl
from vitbench.measure.ib import (
    block_output,
    ib_terms,
    input_vectors,
    soft_assign,
    token_features,
)

__all__ = [
    "MERGE_GRIDS",
    "FirstMerge",
    "LTMParams",
    "ReMerge",
    "TileMerge",
    "block_assign",
    "conv_merge_grid",
    "ib_mask_step",
    "pooling_cells",
    "pooling_logits",
    "refresh_statistics",
    "soft_merge",
    "vit_merge_grid",
]

OPTIMIZERS = ("SGD", "AdamW", "Adam")
STEP_LABELS = ("prior", "true")
#: the first merge's initialisation: ``runs`` (plain ViT default), ``grid`` (average pooling to
#: the merge grid; conv hybrids, whose merge folds to that grid, support only this), ``auto``
INITS = ("auto", "runs", "grid")
#: what trains when the IB step's MLPs are frozen (``mlp_lr=0``): ``M1``, the ``M_l`` logits, ``s_l``
TRAINED_WITHOUT_MLPS = (".reducer.logits", ".reducer.mask_logits", ".reducer.scale")
FEATURES_KEY = "ltm_features"  # ctx.extras: the final block's features for the IB bound
_OUTSIDE_LOGIT = -12.0  # M1 / tau outside the pooling window (e^-12: a 6e-6 leak per patch)
_KEEP_LOGIT = 3.0  # initial M_l logits: keep (95% kept under training noise at tau = 1)
_EPS = 1e-12


@dataclass(frozen=True)
class LTMParams:
    """``ratio``: P = ceil(ratio * N_p) tokens after block 1; ``eta``: the IB step size;
    ``tau``: Gumbel temperature of both masks; ``ib_weight``: weight of the IB bound in the
    loss; ``mlp_ratio``: hidden width of the per-block MLP / C; ``stats_images``: training
    images per statistics pass (0: all)."""

    ratio: float = 0.7
    eta: float = 1.0
    tau: float = 1.0
    #: two epochs of the default's 10k images (314 steps, ~2 min on 2 CPU cores). Measured on the
    #: default model (all 10k test images; baseline 81.26 %; runs init, prior step, sizes without
    #: gradient, MLPs frozen): 78.6-79.2 % over seeds 0-2 and 1 or 2 threads.
    epochs: int = 2
    #: AdamW moves each parameter by about ``lr`` per step, and the mask logits live in nats
    #: (the untrained first mask is 0 / -12): in a few hundred steps 1e-3 leaves them where they
    #: started. ``lr`` trains ``M1``, the ``M_l`` logits and the scales ``s_l``.
    lr: float = 0.3
    #: the per-block MLPs of the IB step (``X~ = MLP(Z)``): 0 (default) keeps them frozen at their
    #: initialisation; ``None``: ``lr``. Training them moves ``X~`` away from the centroids of the
    #: last statistics pass, so the step mixes tokens by stale clusters. Measured (all 10k test
    #: images, seeds 1 and 2): frozen 78.6 / 78.8 %; ``mlp_lr=lr`` 69.8-79.6 % (chaotic across
    #: seeds and threads); MLPs, masks and scales at 0.01: 55.1 / 36.5 %.
    mlp_lr: Optional[float] = 0.0
    optimizer: str = "AdamW"
    ib_weight: float = 1.0
    batch_size: int = 64
    mlp_ratio: float = 0.25
    stats_images: int = 2048
    trace_source: bool = False
    step_labels: str = "prior"
    init: str = "auto"

    def __post_init__(self) -> None:
        checks = [
            ("ratio", 0.0 < self.ratio <= 1.0, "in (0, 1]"),
            ("eta", self.eta >= 0.0, ">= 0"),
            ("tau", self.tau > 0.0, "> 0"),
            ("epochs", self.epochs >= 0, "an integer >= 0"),
            ("lr", self.lr > 0.0, "> 0"),
            ("mlp_lr", self.mlp_lr is None or self.mlp_lr >= 0.0, ">= 0 (0: frozen; None: the same as lr)"),
            ("ib_weight", self.ib_weight >= 0.0, ">= 0"),
            ("batch_size", self.batch_size >= 1, "an integer >= 1"),
            ("mlp_ratio", self.mlp_ratio > 0.0, "> 0"),
            ("stats_images", self.stats_images >= 0, "an integer >= 0 (0: all training images)"),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise ParamError(f"ltm.{name}={getattr(self, name)!r} is out of range; it must be {valid}")
        if self.init not in INITS:
            raise ParamError(f"ltm.init={self.init!r} is not supported; valid: {', '.join(INITS)}")
        if self.step_labels not in STEP_LABELS:
            raise ParamError(f"ltm.step_labels={self.step_labels!r} is not supported; valid: {', '.join(STEP_LABELS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ParamError(f"ltm.optimizer={self.optimizer!r} is not supported; valid: {', '.join(OPTIMIZERS)}")


# -- shapes and the pooling initialisation ---------------------------------------------------
GridFn = Callable[[ModelInfo, float], tuple[int, tuple[int, int]]]


def vit_merge_grid(info: ModelInfo, ratio: float) -> tuple[int, tuple[int, int]]:
    """Plain ViT: ``P = ceil(ratio * N_p)`` on a ``ceil(sqrt(P))`` square grid."""
    p = max(1, math.ceil(ratio * info.num_patches - 1e-9))  # 1e-9: 0.7 * 10 is 7.000000000000001
    side = math.isqrt(p - 1) + 1  # ceil(sqrt(p)), exact
    return p, (side, side)


def conv_merge_grid(info: ModelInfo, ratio: float) -> tuple[int, tuple[int, int]]:
    """Conv hybrids keep a grid (docs/methods.md §5): ``H' = ceil(H sqrt(ratio))``, ``W'`` likewise,
    ``P = H'W'``; ``info`` describes one token sequence (its ``grid`` is the one it sees)."""
    root = math.sqrt(ratio)
    h, w = (max(1, math.ceil(n * root - 1e-9)) for n in info.grid)  # 1e-9: float noise at ratio 1
    return h * w, (h, w)


#: family name -> its ``(info, ratio) -> (P, (H', W'))``; a hybrid family adapter adds its own
MERGE_GRIDS: dict[str, GridFn] = {"vit": vit_merge_grid, "mobilevit": conv_merge_grid, "swin": vit_merge_grid}

#: families whose every block reduces its own full tiles for the MLP only and unmerges after it
#: (Swin, docs/methods.md §5 "On Swin"): each block gets a :class:`TileMerge`
TILE_FAMILIES = ("swin",)

#: hybrids, whose merged sequences fold back to a smaller map that the next sequence sees:
#: family -> ``(info, shrink) -> [(grid seen, grid folded to)]`` per sequence, ``shrink(s, grid)``
#: the grid sequence ``s`` folds to (the family adapter's rule)
SEQUENCE_GRIDS: dict[str, Callable[..., list[tuple[tuple[int, int], tuple[int, int]]]]] = {
    "mobilevit": mobilevit_sequence_grids,
}


def pooling_cells(num_cells: int, p: int) -> torch.Tensor:
    """The ``p`` grid cells (raster indices) the merged tokens start from, spread evenly."""
    return torch.floor(torch.linspace(0, num_cells - 1, p, dtype=torch.float64) + 0.5).long()


def _windows(n: int, m: int) -> torch.Tensor:
    """``[m, n]``: which of ``n`` inputs adaptive average pooling to ``m`` outputs averages."""
    i, r = torch.arange(m), torch.arange(n)
    start, end = (i * n) // m, -((-(i + 1) * n) // m)
    return (r[None] >= start[:, None]) & (r[None] < end[:, None])


def pooling_logits(grid: tuple[int, int], cells: tuple[int, int], p: int, outside: float) -> torch.Tensor:
    """``M1 [H*W, p]``: 0 inside each merged token's pooling window, ``outside`` elsewhere."""
    (h, w), (gh, gw) = grid, cells
    rows, cols = _windows(h, gh), _windows(w, gw)
    inside = (rows[:, None, :, None] & cols[None, :, None, :]).reshape(gh * gw, h * w)
    inside = inside[pooling_cells(gh * gw, p)].t()
    return torch.where(inside, torch.tensor(0.0), torch.tensor(outside))


def snake_order(grid: tuple[int, int]) -> torch.Tensor:
    """The raster indices of an ``H x W`` grid along a boustrophedon path (row 0 left to right,
    row 1 right to left, ...): consecutive entries are always spatial neighbours."""
    h, w = grid
    rows = [torch.arange(r * w, (r + 1) * w) for r in range(h)]
    return torch.cat([row if r % 2 == 0 else row.flip(0) for r, row in enumerate(rows)])


def run_logits(grid: tuple[int, int], cells: tuple[int, int], p: int, outside: float) -> torch.Tensor:
    """``M1 [H*W, p]`` for the least pooling that reaches ``p`` tokens: the path of
    :func:`snake_order` is cut into ``p`` contiguous runs of ``floor(N/p)`` or ``ceil(N/p)``
    patches (cut points ``floor(linspace(0, N, p + 1) + 0.5)``, so the longer runs are spread
    evenly), merged token ``q`` averages run ``q`` (0 inside, ``outside`` elsewhere), and the
    tokens are ordered by the first patch (raster order) of their run, so ``p = N`` is the
    identity. ``cells`` is unused (the signature of :func:`pooling_logits`)."""
    n = grid[0] * grid[1]
    path = snake_order(grid)
    cuts = torch.floor(torch.linspace(0, n, p + 1, dtype=torch.float64) + 0.5).long()
    runs = sorted((path[cuts[q]:cuts[q + 1]] for q in range(p)), key=lambda run: int(run.min()))
    logits = torch.full((n, p), float(outside))
    for q, run in enumerate(runs):
        logits[run, q] = 0.0
    return logits


# -- the merge -------------------------------------------------------------------------------
def soft_merge(x: torch.Tensor, state: TokenState, g: torch.Tensor) -> torch.Tensor:
    """``x [B, prefix + N_in, C]`` -> ``[B, prefix + P, C]`` with ``G [B, N_in, P]``: merged
    token ``q`` is ``sum_i G_iq x_i``; sizes and sources follow the row shares (module doc)."""
    prefix = state.prefix
    merged = g.mT @ x[:, prefix:]  # [B or 1, P, N_in] @ [B, N_in, C]
    # bookkeeping without gradient: d(share)/dG ~ 1/row-sum, and a token every merged token has
    # learned to ignore has a row sum near 0 (gradients of 1e30 and inf overflowed AdamW: the
    # NaN divergence of issue 9); see "Sizes and sources" in the module doc
    g_rows = g.detach()
    share_t = (g_rows / g_rows.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(g.dtype).tiny)).mT
    size = state.sizes(x)
    state.size = torch.cat([size[:, :prefix], share_t @ size[:, prefix:]], dim=1)
    if state.source is not None:
        source = state.source
        state.source = torch.cat([source[:, :prefix], share_t @ source[:, prefix:]], dim=1)
    return torch.cat([x[:, :prefix], merged], dim=1)


class _Shared:
    """What all LTM modules of one model share (a plain object: not in the state dict): the
    reduction context (bound by the callbacks and ``prepare_load``; the labels in training) and,
    during a statistics pass, the ``X~`` each block records."""

    def __init__(self) -> None:
        self.ctx: Any = None
        self.recording: dict[nn.Module, torch.Tensor] | None = None
        self.hook: Any = None
        #: the IB step of training uses the true label (``step_labels="true"``) or, as at
        #: inference, its expectation under the class prior (``"prior"``, the default)
        self.true_labels = False


class FirstMerge(nn.Module):
    """Block 1: ``N_p`` patch tokens -> ``P`` by ``G1 = column-softmax(M1)`` (module doc).

    Also holds the statistics of the IB bound used as the training loss: the final features'
    class centroids, their ``log Q(a|y)`` and the input clusters' centroids.
    """

    needs: frozenset[str] = frozenset()

    def __init__(self, grid: tuple[int, int], cells: tuple[int, int], p: int, dim: int, tau: float,
                 shared: _Shared, fold_grid: bool = False, init: str = "grid") -> None:
        super().__init__()
        self.num_patches, self.p, self.tau = grid[0] * grid[1], p, tau
        #: conv hybrids: the merge is declared as a grid merge to ``cells`` (the adapter folds
        #: the tokens to that grid and merges its fusion shortcut alike, docs/methods.md §5)
        self.records_grid_merge = fold_grid
        self.cells = tuple(cells)
        start = run_logits if init == "runs" else pooling_logits
        self.logits = nn.Parameter(start(grid, cells, p, _OUTSIDE_LOGIT * tau))
        self._shared = shared
        self.register_buffer("feature_centroids", torch.zeros(0, dim))
        self.register_buffer("feature_log_q", torch.zeros(0, 0))
        self.register_buffer("input_centroids", torch.zeros(0, 0))

    def weights(self, batch: int) -> torch.Tensor:
        """``G1 [B, N_p, P]`` in training (Gumbel noise per image), ``[1, N_p, P]`` at inference."""
        return _first_weights(self.logits, self.tau, self.training, batch)

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if x.shape[1] - state.prefix != self.num_patches:
            raise ValueError(f"ltm: block 1 expects {self.num_patches} patch tokens, got "
                             f"{x.shape[1] - state.prefix} (the merge is sized for the model's grid)")
        g = self.weights(x.shape[0])
        if self.records_grid_merge:
            record_grid_merge(state, g, self.cells)  # type: ignore[arg-type]
        return soft_merge(x, state, g)


def _first_weights(logits: torch.Tensor, tau: float, training: bool, batch: int) -> torch.Tensor:
    """``column-softmax((M1 + g) / tau)`` ``[B, N, P]`` with Gumbel noise ``g`` per sequence in
    training; ``[1, N, P]`` without noise at inference."""
    logits = logits[None]
    if training:
        logits = logits + _gumbel((batch, *logits.shape[1:]), logits)
    return (logits / tau).softmax(dim=-2)


def block_assign(xt: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``tau(X~, a) = softmax_a(-dist(X~, C_a))`` ``[B, K]``, ``dist`` the mean squared
    distance of ``X~ [B, P, C]`` to each ``C_a [P, C]``."""
    n = xt.shape[1] * xt.shape[2]
    cross = torch.einsum("bpc,kpc->bk", xt, centroids)
    dist = (xt.pow(2).sum(dim=(1, 2))[:, None] - 2 * cross + centroids.pow(2).sum(dim=(1, 2))[None]) / n
    return (-dist).softmax(dim=1)


def ib_mask_step(xt: torch.Tensor, centroids: torch.Tensor, log_q_rows: torch.Tensor, eta: float) -> torch.Tensor:
    """``G~ = I - 2 eta sum_a X~ (S_a/gamma^2)(gamma C_a - zeta)^T psi_a`` ``[B, P, P]``.

    ``xt [B, P, C]`` is ``X~``, ``centroids [K, P, C]``, ``log_q_rows [B or 1, K]`` the
    ``log Q(a|y)`` row of each image's label (or its expectation). With ``tau_a = S_a/gamma``,
    ``(S_a/gamma^2)(gamma C_a - zeta) = tau_a (C_a - sum_b tau_b C_b)``, so the sum is
    ``X~ V^T`` with ``V = sum_a tau_a (psi_a - sum_b tau_b psi_b) C_a``; an ``a``-independent
    part of ``psi`` (the input term) cancels, hence ``psi_a = -log Q(a|y)`` (module doc).
    """
    tau = block_assign(xt, centroids)
    w = tau * -log_q_rows
    v = torch.einsum("bk,kpc->bpc", w - tau * w.sum(dim=1, keepdim=True), centroids)
    eye = torch.eye(xt.shape[1], dtype=xt.dtype, device=xt.device)
    return eye - 2.0 * eta * torch.einsum("bpc,bqc->bpq", xt, v)


class ReMerge(nn.Module):
    """A later block: ``P`` tokens -> ``P`` by one IB gradient step from the identity."""

    needs: frozenset[str] = frozenset()

    def __init__(self, p: int, dim: int, hidden: int, eta: float, tau: float, shared: _Shared,
                 fold_grid: bool = False) -> None:
        super().__init__()
        self.p, self.eta, self.tau = p, eta, tau
        self.records_grid_merge = fold_grid  # conv hybrids: appended to the sequence's grid merge
        self.mask_logits = nn.Parameter(torch.full((p, p), _KEEP_LOGIT))
        self.scale = nn.Parameter(torch.tensor(math.log(99.0 * max(p - 1, 1))))
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self._shared = shared
        self.register_buffer("centroids", torch.zeros(0, p, dim))
        self.register_buffer("log_q", torch.zeros(0, 0))
        self.register_buffer("class_prior", torch.zeros(0))

    def log_q_rows(self) -> torch.Tensor | None:
        """``log Q(a|y)`` per image (training, labels known) or its prior expectation ``[1, K]``;
        ``None`` before the first statistics pass."""
        if self.log_q.shape[0] == 0:
            return None
        ctx = self._shared.ctx
        labels = ctx.labels if self.training and self._shared.true_labels and ctx is not None else None
        if labels is not None:
            return self.log_q[labels.long()]
        return (self.class_prior @ self.log_q)[None]

    def keep_mask(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The binary mask ``M_l``: ``(hard, straight-through)`` ``[B or 1, P, P]``, diagonal kept."""
        logits = self.mask_logits[None]
        if self.training:  # noise drawn per image
            logits = logits.expand(batch, -1, -1)
        st = straight_through_mask(logits, self.tau, noisy=self.training)
        eye = torch.eye(self.p, dtype=torch.bool, device=logits.device)
        return st.detach().masked_fill(eye, 1.0), st.masked_fill(eye, 1.0)

    def mixing(self, z: torch.Tensor) -> torch.Tensor:
        """``G_l [B, P, P]`` for the patch tokens ``z [B, P, C]`` entering the merge."""
        b, p, _ = z.shape
        xt = self.mlp(z)
        if self._shared.recording is not None:
            self._shared.recording[self] = xt.detach()
        rows = self.log_q_rows()
        if rows is None:
            g_tilde = torch.eye(p, dtype=z.dtype, device=z.device).expand(b, p, p)
        else:
            if rows.shape[0] not in (1, b):  # hybrids: an image's labels for each of its sequences
                rows = rows.repeat_interleave(b // rows.shape[0], dim=0)
            g_tilde = ib_mask_step(xt, self.centroids, rows, self.eta)
        hard, st = self.keep_mask(b)
        logits = self.scale * g_tilde
        ref = logits.masked_fill(hard == 0, float("-inf")).amax(dim=-2, keepdim=True).detach()
        e = torch.exp((logits - ref).clamp_max(0.0)) * st  # a dropped entry may exceed ref: clamp
        return e / e.sum(dim=-2, keepdim=True)

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        g = self.mixing(x[:, state.prefix:])
        if self.records_grid_merge:
            record_grid_merge(state, g)
        return soft_merge(x, state, g)


class TileMerge(ReMerge):
    """Swin (docs/methods.md §5 "On Swin"): one block's merge of each ``t``-token tile of its map
    into ``P`` tokens for the MLP, both steps of LTM in one block.

    1. the learned first mask of the block (:class:`FirstMerge`'s ``G1 = column-softmax((M1 + g)
       / tau)``, ``M1 [t, P]`` shared by all tiles of the block, initialised by ``init`` on the
       tile's grid): ``Z = G1^T x``;
    2. the IB step of :class:`ReMerge` on ``Z`` (``X~ = MLP_l(Z)``, the block's class centroids
       of ``X~`` -- every tile a sample of its image's class --, the binary mask ``M_l`` and the
       scale ``s_l``): ``G_l^T Z``.

    Sizes and sources follow both soft merges (:func:`soft_merge`); :meth:`unmerge` sends each
    token of the tile the share-weighted mix of the MLP outputs of the merged tokens it went
    into. Also holds the IB bound's buffers (filled in the first block's module only), as
    :class:`FirstMerge`.
    """

    def __init__(self, grid: tuple[int, int], cells: tuple[int, int], p: int, dim: int, hidden: int,
                 eta: float, tau: float, shared: _Shared, init: str = "runs") -> None:
        super().__init__(p, dim, hidden, eta, tau, shared)
        self.num_patches = grid[0] * grid[1]
        start = run_logits if init == "runs" else pooling_logits
        self.logits = nn.Parameter(start(grid, cells, p, _OUTSIDE_LOGIT * tau))
        self.register_buffer("feature_centroids", torch.zeros(0, dim))
        self.register_buffer("feature_log_q", torch.zeros(0, 0))
        self.register_buffer("input_centroids", torch.zeros(0, 0))

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if x.shape[1] != self.num_patches or state.prefix:
            raise ValueError(f"ltm: this Swin block merges tiles of {self.num_patches} tokens without "
                             f"prefix, got {x.shape[1]} tokens and {state.prefix} prefix (the merge is "
                             f"sized for the model's input size)")
        z = soft_merge(x, state, _first_weights(self.logits, self.tau, self.training, x.shape[0]))
        return soft_merge(z, state, self.mixing(z))

    def unmerge(self, y: torch.Tensor, state: TokenState) -> torch.Tensor:
        """``[B*nT, P, C]`` MLP outputs -> ``[B*nT, t, C]``: token ``i`` takes ``sum_q
        source_qi y_q``, its shares of the merged tokens (each column of the traced sources sums
        to 1; a hard merge gives ToMe for SD's copy). The shares carry no gradient, as in
        :func:`soft_merge`."""
        assert state.source is not None, "the swin adapter traces sources"
        return state.source.mT.to(y.dtype) @ y


def _gumbel(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    u = torch.rand(shape, device=like.device, dtype=like.dtype).clamp(_EPS, 1 - _EPS)
    return -torch.log(-torch.log(u))


# -- statistics (Algorithm 1) ----------------------------------------------------------------
_BLOCKS = (ReducingBlock, SwinReducingBlock)


def _reducing_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's reducing blocks in forward order (``model.blocks`` of a ViT; the transformer
    blocks of every MobileViT block of a hybrid; every block of every Swin stage)."""
    return [m for m in model.modules() if isinstance(m, _BLOCKS)]


def _modules(model: nn.Module) -> tuple[FirstMerge | TileMerge, list[ReMerge]]:
    """The first block's :class:`FirstMerge` or :class:`TileMerge` (it holds the IB bound's
    statistics) and every module with an IB step, :class:`ReMerge` (a hybrid has one
    :class:`FirstMerge` per token sequence; on Swin every block's :class:`TileMerge` has one)."""
    reducers = [blk.reducer for blk in _reducing_blocks(model)]
    if not reducers or not isinstance(reducers[0], (FirstMerge, TileMerge)):
        raise ValueError("this model is not reduced with ltm (vitbench.apply(model, 'ltm'))")
    return reducers[0], [r for r in reducers if isinstance(r, ReMerge)]


def _image_rows(onehot: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-image rows repeated for each token sequence of the image (hybrids run ``B*k``
    sequences, image-major: MobileViT's ``k = 4``); unchanged for a plain ViT."""
    return onehot if rows == onehot.shape[0] else onehot.repeat_interleave(rows // onehot.shape[0], dim=0)


def _image_features(tokens: torch.Tensor, prefix: int, size: torch.Tensor | None, batch: int) -> torch.Tensor:
    """:func:`~vitbench.measure.ib.token_features` per image: a hybrid's ``B*k`` sequences of an
    image (no prefix) count as one sequence of ``k`` times the tokens; a Swin block's output map
    ``[B, H, W, C]`` (every token kept, size 1) is averaged over its positions."""
    if tokens.dim() == 4:
        return tokens.mean(dim=(1, 2))
    if tokens.shape[0] != batch:
        tokens = tokens.reshape(batch, -1, tokens.shape[-1])
        size = size.reshape(batch, -1, 1) if size is not None else None
    return token_features(tokens, prefix, size)


def final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: the size-weighted mean of the last reducing block's patch tokens, per image
    (:func:`vitbench.measure.ib.final_features`, extended to hybrids)."""
    tokens = block_output(model, _reducing_blocks(model)[-1], images)
    ctx = reduction_context(model)
    return _image_features(tokens, ctx.prefix, ctx.state.size, images.shape[0])


def _bind(model: nn.Module) -> FirstMerge:
    first, _ = _modules(model)
    first._shared.ctx = reduction_context(model)
    return first


def _limited(batches: Callable[[], Iterator[Any]], max_images: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    seen = 0
    for images, labels in batches():
        if max_images:
            images, labels = images[: max_images - seen], labels[: max_images - seen]
        seen += len(labels)
        yield images, labels
        if max_images and seen >= max_images:
            return


def _log_q(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``log Q(a|y)`` from per-class sums of ``tau``, as :func:`vitbench.measure.ib.log_q_given_y`."""
    q = sums / counts.clamp_min(1)[:, None]
    q = torch.where(counts[:, None] > 0, q, torch.full_like(q, 1.0 / sums.shape[1]))
    return q.clamp_min(_EPS).log()


def refresh_statistics(model: nn.Module, batches: Callable[[], Iterator[Any]], max_images: int = 0) -> None:
    """Algorithm 1's refresh: recompute every block's centroids, ``Q`` and the class prior, and
    the IB bound's feature/input centroids and ``Q``, over the first ``max_images`` images of
    ``batches()`` (0: all), in eval mode without gradients; see the module doc."""
    first, later = _modules(model)
    shared = _bind(model)._shared
    k = int(getattr(model, "num_classes", 0) or 0)
    if k < 1:
        raise UnsupportedError("ltm needs a classification head (model.num_classes >= 1) for its class clusters")
    was_training = model.training
    model.eval()
    shared.recording = {}
    try:
        with torch.no_grad():
            # pass 1: centroids, prior, input and feature centroids
            counts, sums, feat_sums, input_sums = None, {}, None, None
            block_counts: dict[ReMerge, torch.Tensor] = {}  # per block: hybrids see k per image
            for images, labels in _limited(batches, max_images):
                feats = final_features(model, images).float()
                onehot = F.one_hot(labels.long(), k).float().to(feats.device)
                counts = onehot.sum(0) if counts is None else counts + onehot.sum(0)
                for m in later:
                    rec = shared.recording[m].flatten(1).float()
                    rows = _image_rows(onehot, rec.shape[0])
                    s = rows.t() @ rec
                    sums[m] = s if m not in sums else sums[m] + s
                    block_counts[m] = rows.sum(0) if m not in block_counts else block_counts[m] + rows.sum(0)
                fs, xs = onehot.t() @ F.normalize(feats, dim=1), onehot.t() @ input_vectors(images)
                feat_sums = fs if feat_sums is None else feat_sums + fs
                input_sums = xs if input_sums is None else input_sums + xs
            if counts is None:
                raise ValueError("ltm: the statistics pass got no training batches")
            centroids = {m: (sums[m] / block_counts[m].clamp_min(1)[:, None]).view(k, *m.centroids.shape[1:])
                         for m in later}
            feat_centroids, input_centroids = F.normalize(feat_sums, dim=1), F.normalize(input_sums, dim=1)
            prior = counts / counts.sum()
            # pass 2: Q(a|y) against the new centroids (the forward still uses the old ones)
            counts2, q_sums, feat_q_sums = torch.zeros_like(counts), {m: 0.0 for m in later}, 0.0
            block_counts2 = {m: torch.zeros_like(counts) for m in later}
            for images, labels in _limited(batches, max_images):
                feats = final_features(model, images).float()
                onehot = F.one_hot(labels.long(), k).float().to(feats.device)
                counts2 += onehot.sum(0)
                for m in later:
                    rec = shared.recording[m].float()
                    rows = _image_rows(onehot, rec.shape[0])
                    q_sums[m] = q_sums[m] + rows.t() @ block_assign(rec, centroids[m])
                    block_counts2[m] += rows.sum(0)
                feat_q_sums = feat_q_sums + onehot.t() @ soft_assign(feats, feat_centroids)
    finally:
        shared.recording = None
        model.train(was_training)
    for m in later:
        like = m.mask_logits
        m.centroids = centroids[m].to(like)
        m.log_q = _log_q(q_sums[m], block_counts2[m]).to(like)
        m.class_prior = prior.to(like)
    like = first.logits
    first.feature_centroids = feat_centroids.to(like)
    first.feature_log_q = _log_q(feat_q_sums, counts2).to(like)
    first.input_centroids = input_centroids.to(like)


# -- training hooks --------------------------------------------------------------------------
class _FinalFeatures:
    """Forward hook on the last block: its size-weighted patch features into ``ctx.extras``."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def __call__(self, module: nn.Module, args: Any, out: torch.Tensor) -> None:
        size = self.ctx.state.size if self.ctx.state is not None else None
        batch = self.ctx.inputs.shape[0] if self.ctx.inputs is not None else out.shape[0]
        self.ctx.extras[FEATURES_KEY] = _image_features(out, self.ctx.prefix, size, batch)


def _before(model: nn.Module, batches: Callable[[], Iterator[Any]], max_images: int, ib_loss: bool) -> None:
    first = _bind(model)
    shared = first._shared
    if ib_loss and shared.hook is None:
        shared.hook = _reducing_blocks(model)[-1].register_forward_hook(_FinalFeatures(shared.ctx))
    refresh_statistics(model, batches, max_images)


def _epoch_end(model: nn.Module, epoch: int, batches: Callable[[], Iterator[Any]], max_images: int,
               epochs: int) -> None:
    """Algorithm 1's refresh for the *next* epoch: none after the last one (``epoch`` counts from
    0), so the evaluated model runs the statistics its masks and MLPs were trained against."""
    if epoch + 1 < epochs:
        refresh_statistics(model, batches, max_images)


def _after(model: nn.Module) -> None:
    shared = _modules(model)[0]._shared
    if shared.hook is not None:
        shared.hook.remove()
        shared.hook = None


def ib_bound_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor, weight: float) -> torch.Tensor:
    """``weight *`` the IB bound (§6) of this forward's final features, with the previous
    refresh's centroids and ``log Q`` (the stage's ``extra_loss``)."""
    ctx = reduction_context(model)
    first, _ = _modules(model)
    feats = ctx.extras.get(FEATURES_KEY) if ctx is not None else None
    if feats is None or first.feature_log_q.shape[0] == 0:
        raise RuntimeError("ltm: the IB loss needs the statistics pass and the feature hook of the "
                           "stage's `before` callback to have run")
    tau_f = soft_assign(feats, first.feature_centroids)
    tau_x = soft_assign(input_vectors(ctx.inputs), first.input_centroids)
    terms = ib_terms(tau_f, tau_x, labels, first.feature_log_q.shape[0], log_q=first.feature_log_q)
    return weight * terms.bound


def prepare_load(model: nn.Module, state_dict: dict) -> None:
    """Size the statistics buffers like the saved ones (they are empty until the first refresh)
    and bind the modules to the model's context."""
    for path, blk in model.named_modules():
        module = getattr(blk, "reducer", None) if isinstance(blk, _BLOCKS) else None
        if not isinstance(module, (FirstMerge, ReMerge)):
            continue
        for name, buf in list(module.named_buffers(recurse=False)):
            saved = state_dict.get(f"{path}.reducer.{name}")
            if saved is not None and saved.shape != buf.shape:
                setattr(module, name, buf.new_zeros(saved.shape))
    _bind(model)


def _hybrid_reducers(params: LTMParams, info: ModelInfo, grid_fn: GridFn, shared: _Shared) -> list[nn.Module]:
    """Conv hybrids (docs/methods.md §5): per token sequence, its first block merges the ``H x W``
    tokens it sees to ``P = H'W'`` (:class:`FirstMerge`, logits sized for that sequence), its
    later blocks re-merge ``P -> P`` (:class:`ReMerge`, the block's own width), and every merge
    is declared a grid merge to ``(H', W')`` so that the adapter folds to that grid and merges
    the fusion shortcut with the same matrices. The grid a sequence sees follows from the
    merges before it (:data:`SEQUENCE_GRIDS`); all modules share one ``_Shared``, the first
    block's :class:`FirstMerge` holds the IB bound's statistics."""
    chain = SEQUENCE_GRIDS.get(info.family)
    if chain is None:
        raise UnsupportedError(f"ltm does not know how the token grids of the {info.family!r} family "
                               f"follow from each other; known: {', '.join(sorted(SEQUENCE_GRIDS))}")

    def sequence_info(grid: tuple[int, int]) -> ModelInfo:
        return dataclasses.replace(info, grid=grid, num_patches=grid[0] * grid[1], blocks=())

    plan = chain(info, lambda s, grid: grid_fn(sequence_info(grid), params.ratio)[1])
    reducers: list[nn.Module] = []
    for blk in info.blocks:
        seen, cells = plan[blk.sequence]
        p = cells[0] * cells[1]
        if blk.first:
            reducers.append(FirstMerge(seen, cells, p, blk.dim, params.tau, shared, fold_grid=True))
        else:
            hidden = max(1, round(params.mlp_ratio * blk.dim))
            reducers.append(ReMerge(p, blk.dim, hidden, params.eta, params.tau, shared, fold_grid=True))
    return reducers


def _tile_reducers(params: LTMParams, info: ModelInfo, grid_fn: GridFn, shared: _Shared) -> list[nn.Module]:
    """Swin (docs/methods.md §5 "On Swin"): every block merges each of its tiles (``info.blocks[i].grid``,
    ``t`` tokens) into ``P = ceil(ratio * t)`` tokens for its MLP (:class:`TileMerge`, the block's
    own width), initialised as on ViT (``auto``: ``runs``)."""
    init = "runs" if params.init == "auto" else params.init
    reducers: list[nn.Module] = []
    for blk in info.blocks:
        tile = dataclasses.replace(info, grid=blk.grid, num_patches=blk.num_patches, blocks=())
        p, cells = grid_fn(tile, params.ratio)
        hidden = max(1, round(params.mlp_ratio * blk.dim))
        reducers.append(TileMerge(blk.grid, cells, p, blk.dim, hidden, params.eta, params.tau, shared, init=init))
    return reducers


def build(params: LTMParams, info: ModelInfo) -> Reduction:
    grid_fn = MERGE_GRIDS.get(info.family)
    if grid_fn is None:
        raise UnsupportedError(f"ltm has no merge grid for the {info.family!r} family; "
                               f"known: {', '.join(sorted(MERGE_GRIDS))}")
    if info.grid[0] * info.grid[1] != info.num_patches:
        raise UnsupportedError(f"ltm needs a patch grid: grid {info.grid} does not hold {info.num_patches} patches")
    if info.blocks and params.init == "runs" and info.family not in TILE_FAMILIES:
        raise UnsupportedError(f"ltm.init='runs' does not apply to the {info.family!r} family: its merge "
                               f"folds back to a grid; valid there: auto, grid")
    shared = _Shared()
    shared.true_labels = params.step_labels == "true"
    if info.family in TILE_FAMILIES:
        reducers = _tile_reducers(params, info, grid_fn, shared)
    elif info.blocks:
        reducers = _hybrid_reducers(params, info, grid_fn, shared)
    else:
        p, cells = grid_fn(info, params.ratio)
        hidden = max(1, round(params.mlp_ratio * info.embed_dim))
        init = "runs" if params.init == "auto" else params.init
        reducers = [FirstMerge(info.grid, cells, p, info.embed_dim, params.tau, shared, init=init)]
        reducers += [ReMerge(p, info.embed_dim, hidden, params.eta, params.tau, shared) for _ in range(1, info.depth)]
    for module in reducers:  # start deterministic, like the (eval-mode) models vitbench reduces;
        module.eval()  # model.train() turns the Gumbel noise on
    ib_loss = params.ib_weight > 0
    mlp_lr = params.lr if params.mlp_lr is None else params.mlp_lr
    stage = TrainStage(
        name="finetune", epochs=params.epochs, optimizer=params.optimizer, lr=params.lr,
        batch_size=params.batch_size, lr_groups=((".reducer.mlp.", mlp_lr),) if mlp_lr > 0 else (),
        trainable=None if mlp_lr > 0 else TRAINED_WITHOUT_MLPS,
        extra_loss=functools.partial(ib_bound_loss, weight=params.ib_weight) if ib_loss else None,
        before=(functools.partial(_before, max_images=params.stats_images, ib_loss=ib_loss),),
        epoch_end=(functools.partial(_epoch_end, max_images=params.stats_images, epochs=params.epochs),),
        after=(_after,),
    )
    return Reduction(reducers, prop_attn=True, trace_source=params.trace_source, train=(stage,),
                     prepare_load=prepare_load)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="ltm",
        kind="merging",
        params=LTMParams,
        build=build,
        families=("vit", "mobilevit", "swin"),
        aliases=("ibtm",),
        needs_training=True,
        # P = ceil(ratio * N_p) tokens: the count is fixed by ratio, so it is searched before training
        budget=dict(param="ratio", larger_means="more", low=0.001, high=1.0),
        description="LTM/IBTM: learnable token merging by one IB-bound gradient step per block "
                    "(P = ceil(ratio * N_p) tokens after block 1; fine-tuned masks)",
    ))
