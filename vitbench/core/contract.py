"""What a family and a method hand the engine: a backbone's description (:class:`ModelInfo`,
:class:`BlockInfo`) and a method's contribution to one model (:class:`Reduction`, its training
stages :class:`TrainStage`); docs/architecture.md, "Engine". Plugins import them from
:mod:`vitbench.catalog`, which re-exports them."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

__all__ = ["BlockInfo", "ModelInfo", "Reduction", "StatsCallback", "TrainStage"]


@dataclass(frozen=True)
class BlockInfo:
    """One attention block of a backbone whose blocks differ (conv hybrids, docs/architecture.md
    "Engine"): its width, heads, the token grid it sees, and which token sequence it belongs to
    (MobileViT: one sequence per MobileViT block; the state restarts at each ``first`` block)."""

    dim: int
    num_heads: int
    num_patches: int
    grid: tuple[int, int]
    sequence: int = 0
    first: bool = False


@dataclass(frozen=True)
class ModelInfo:
    """A family adapter's uniform description of a backbone (what a method may size itself by).

    Plain ViTs fill the scalar fields; hybrids also fill ``blocks`` (one :class:`BlockInfo` per
    attention block, in forward order), and their scalar fields describe the first block.
    ``input_size`` is the ``(H, W)`` the description was made for (token grids depend on it).
    """

    family: str
    depth: int
    embed_dim: int
    num_heads: int
    num_prefix_tokens: int
    num_patches: int
    grid: tuple[int, int]
    has_dist_token: bool = False
    global_pool: str = "token"
    blocks: tuple[BlockInfo, ...] = ()
    input_size: tuple[int, int] = (0, 0)
    #: the image's patch grid before any stage merges patches; (0, 0): the same as ``grid``
    patch_grid: tuple[int, int] = (0, 0)
    #: a smaller input's patch grid must have sides that are multiples of this (Swin: 2 ** (stages - 1))
    patch_grid_step: int = 1
    #: the classifier's classes (0: the model has no classification head, or the family does not say)
    num_classes: int = 0

    @property
    def image_grid(self) -> tuple[int, int]:
        """The image's patch grid: ``patch_grid``, else ``grid``."""
        return self.patch_grid if min(self.patch_grid) > 0 else self.grid

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    @property
    def max_patches(self) -> int:
        """The most patch tokens any attention block sees (hybrids: over all their sequences)."""
        return max([self.num_patches, *(blk.num_patches for blk in self.blocks)])


#: ``callback(model, batches) -> numbers for the stage's record or None`` (eval mode, no grad)
StatsCallback = Callable[["nn.Module", Callable[[], Any]], Optional[Mapping[str, float]]]


@dataclass(frozen=True)
class TrainStage:
    """One stage of the fine-tuning loop (:mod:`vitbench.train`): a learnable method declares
    its stages; methods never write their own loop (docs/architecture.md, "Plugins").

    Trained: the parameters of the method's modules (its ``nn.Module`` reducers) whose names
    contain one of ``trainable`` (``None``: all of them); with ``--train-backbone`` (or
    ``backbone``) the backbone's too. ``lr_groups`` gives parameter-name substrings their own
    learning rate (LTMP: merge 5e-3, prune 5e-6). ``arch_keys``/``arch_fraction``: parameters
    whose names contain one of ``arch_keys`` are updated on a share ``arch_fraction`` of the
    steps, the others on the rest (DCS's alternating search). ``extra_loss`` reads per-forward values from
    ``reduction_context(model).extras``; its terms are logged separately. The callbacks'
    ``batches()`` yields ``(images [B, C, H, W] normalised like the model's input, labels [B])``;
    what a ``before`` callback returns (names to numbers) goes into the stage's record.
    """

    name: str = "finetune"
    epochs: int = 1
    optimizer: str = "AdamW"  # SGD | AdamW | Adam
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # SGD only
    schedule: str = "cosine"  # cosine | constant
    #: the cosine schedule's last rate as a share of ``lr`` (the IBTM authors' harness: 2e-5 / 2e-4)
    min_lr_ratio: float = 0.01
    lr_groups: tuple[tuple[str, float], ...] = ()
    label_smoothing: float = 0.0
    arch_keys: tuple[str, ...] = ()
    arch_fraction: float = 0.0
    batch_size: int = 64
    trainable: Optional[tuple[str, ...]] = None
    #: ``(model, logits, labels) -> scalar | None`` added to CE (LTMP's penalty, the IB bound)
    extra_loss: Optional[Callable[["nn.Module", "torch.Tensor", "torch.Tensor"], Optional["torch.Tensor"]]] = None
    #: ``callback(model, batches)`` once before the first epoch (LTM's statistics pass, LTMP's calibration)
    before: tuple[StatsCallback, ...] = ()
    #: ``callback(model, epoch, batches)`` after every epoch (statistics, temperature schedules)
    epoch_end: tuple[Callable[["nn.Module", int, Callable[[], Any]], None], ...] = ()
    #: every gradient clamped to ``[-value, value]`` after DDP's average, before each step (LTMP)
    clip_grad_value: Optional[float] = None
    #: ``callback(model)`` after every optimiser step (LTMP clamps its thresholds)
    after_step: tuple[Callable[["nn.Module"], None], ...] = ()
    #: ``callback(model)`` when the stage ends (DCS shrinks its MLPs after the search)
    after: tuple[Callable[["nn.Module"], None], ...] = ()
    #: decay of a moving average that replaces the trained parameters at the stage's end (None: none)
    ema_decay: Optional[float] = None
    #: the backbone trains too, whatever ``--train-backbone`` says (ALGM fine-tunes the whole network)
    backbone: bool = False


@dataclass
class Reduction:
    """What a method contributes to one model: one reducer (or ``None``) per block.

    Each reducer is a ``vitbench.engine.Reducer`` (docs/token-state.md, "The reducer
    contract"): its token step ``reducer(x, state, info) -> x`` and its ``needs`` (what the
    attention of its block must hand over, docs/methods.md, "The hook point"). Blocks whose reducer is ``None``
    only apply proportional attention (when ``prop_attn``) and keep the fused kernel.
    """

    reducers: Sequence[Optional[Callable[..., "torch.Tensor"]]]
    prop_attn: bool = True
    trace_source: bool = False
    #: ``(rows, cols)``: feed the model a smaller image of this grid of patches (``downsample``)
    input_grid: Optional[tuple[int, int]] = None
    # -- learnable methods: what the fine-tuning loop runs ----------------------------------
    #: the training stages in order (empty for training-free methods)
    train: Sequence[TrainStage] = ()
    #: ``(model, state_dict)``: reshape a reduced model so a trained state dict loads strictly
    prepare_load: Optional[Callable[["nn.Module", dict], None]] = None
