"""What plugins register: methods, scorers and model families (docs/architecture.md, "Plugins").

These are plain frozen dataclasses. The plugin host (:mod:`vitbench.plugins`) keeps one
catalog of each and records which plugin registered what.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from vitbench.engine.attention import AttnInfo
    from vitbench.engine.token_state import TokenState


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

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches


#: ``callback(model, batches)``: ``batches()`` iterates the training data once as
#: ``(images [B,C,H,W] normalised like the model's input, labels [B])`` (no grad, eval mode).
StatsCallback = Callable[["nn.Module", Callable[[], Any]], None]


@dataclass(frozen=True)
class TrainStage:
    """One stage of the fine-tuning loop (:mod:`vitbench.train`): a learnable method declares
    its stages; methods never write their own loop (docs/architecture.md, "Plugins").

    Trained: the parameters of the method's modules (its ``nn.Module`` reducers) whose names
    contain one of ``trainable`` (``None``: all of them); with ``--train-backbone`` the
    backbone's too. ``lr_groups`` gives parameter-name substrings their own learning rate (LTMP:
    merge 5e-3, prune 5e-6). ``arch_keys``/``arch_fraction``: parameters whose names contain one
    of ``arch_keys`` are updated on a share ``arch_fraction`` of the steps, the others on the
    rest (DCS's alternating search).
    """

    name: str = "finetune"
    epochs: int = 1
    optimizer: str = "AdamW"  # SGD | AdamW | Adam
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # SGD only
    schedule: str = "cosine"  # cosine | constant
    lr_groups: tuple[tuple[str, float], ...] = ()
    label_smoothing: float = 0.0
    arch_keys: tuple[str, ...] = ()
    arch_fraction: float = 0.0
    batch_size: int = 64
    trainable: Optional[tuple[str, ...]] = None
    #: ``extra_loss(model, logits, labels) -> scalar | None`` added to the CE loss after each
    #: training forward (LTMP's FLOPs penalty, the IB bound); per-forward values come from
    #: ``reduction_context(model).extras``. Its terms are logged separately.
    extra_loss: Optional[Callable[["nn.Module", "torch.Tensor", "torch.Tensor"], Optional["torch.Tensor"]]] = None
    #: ``callback(model, batches)`` once before the first epoch (LTM's statistics pass)
    before: tuple[StatsCallback, ...] = ()
    #: ``callback(model, epoch, batches)`` after every epoch (statistics, temperature schedules)
    epoch_end: tuple[Callable[["nn.Module", int, Callable[[], Any]], None], ...] = ()
    #: ``callback(model)`` after every optimiser step (LTMP clamps its thresholds)
    after_step: tuple[Callable[["nn.Module"], None], ...] = ()
    #: ``callback(model)`` when the stage ends (DCS shrinks its MLPs after the search)
    after: tuple[Callable[["nn.Module"], None], ...] = ()


@dataclass
class Reduction:
    """What a method contributes to one model: one reducer (or ``None``) per block.

    A reducer is a callable ``reducer(x, state, info) -> x`` with an attribute ``needs``
    (a subset of ``{"keys", "cls_attn", "attn", "values"}``) saying what the attention of its
    block must hand over (docs/methods.md §0). Blocks whose reducer is ``None`` only apply
    proportional attention (when ``prop_attn``) and keep the fused kernel.
    """

    reducers: Sequence[Optional[Callable[..., "torch.Tensor"]]]
    prop_attn: bool = True
    trace_source: bool = False
    # -- learnable methods: what the fine-tuning loop runs ----------------------------------
    #: the training stages in order (empty for training-free methods)
    train: Sequence[TrainStage] = ()
    #: ``prepare_load(model, state_dict)``: reshape a freshly reduced model so that a state
    #: dict saved after training loads with ``strict=True`` (DCS: shrink to the saved widths)
    prepare_load: Optional[Callable[["nn.Module", dict], None]] = None


@dataclass(frozen=True)
class MethodSpec:
    """A reduction method as a plugin registers it.

    ``build(params, info)`` turns validated parameters and the model description into a
    :class:`Reduction`. ``params`` is a dataclass type whose fields all have defaults and whose
    ``__post_init__`` raises :class:`vitbench.errors.ParamError` on out-of-range values.
    """

    name: str
    params: type
    build: Callable[[Any, ModelInfo], Reduction]
    families: tuple[str, ...] = ("vit",)
    aliases: tuple[str, ...] = ()
    needs_training: bool = False
    needs_attention_probs: bool = False
    description: str = ""


@dataclass(frozen=True)
class ScorerSpec:
    """A token significance scorer (docs/methods.md §4).

    ``score(info, prefix) -> [B, N - prefix]`` normalised to sum 1 per image; ``needs`` says
    what the block's attention must hand over for it.
    """

    name: str
    score: Callable[["AttnInfo", int], "torch.Tensor"]
    needs: frozenset[str] = field(default_factory=frozenset)
    description: str = ""


@dataclass(frozen=True)
class FamilySpec:
    """A model-family adapter: recognise a backbone, describe it, and patch it with a Reduction."""

    name: str
    matches: Callable[["nn.Module"], bool]
    describe: Callable[["nn.Module"], ModelInfo]
    patch: Callable[["nn.Module", Reduction], "nn.Module"]
    model_patterns: tuple[str, ...] = ()
    description: str = ""
