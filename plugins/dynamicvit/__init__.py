"""DynamicViT: learned, hierarchical token pruning (Rao et al., *DynamicViT: Efficient Vision
Transformers with Dynamic Token Sparsification*, NeurIPS 2021; docs/methods.md, "DynamicViT").

A prediction module (paper Sec. 3.2) at each listed block scores the patch tokens from local and
mask-averaged global features. Training (Sec. 3.3) masks tokens with a straight-through
Gumbel-softmax, applied to later blocks as an attention key bias, and adds the keep-ratio loss
(Sec. 3.4); only the predictors train. Inference keeps the ``ceil(rho^s * N_p)`` most probable
patches at stage ``s``, in position order. The distillation losses are left out.

Parameters: ``keep`` (the paper's ``rho``), ``layers`` (default ``(3, 6, 9)`` as ``topk``/``ppt``),
``ratio_weight`` (``lambda_ratio``), ``tau`` (Gumbel temperature), ``epochs``, ``lr``,
``batch_size``. docs/methods.md, "DynamicViT" lists every choice and where vitbench differs."""
from __future__ import annotations

from dataclasses import dataclass, field

from vitbench.catalog import HELP, BudgetKnob, MethodSpec
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


@dataclass(frozen=True)
class DynamicViTParams:
    """``keep``: the paper's keep ratio ``rho`` (stage ``s`` keeps ``ceil(rho^s N_p)`` patches);
    ``layers``: the blocks with a prediction module (one stage each, in order);
    ``ratio_weight``: weight of the keep-ratio loss (the paper's ``lambda_ratio``); ``tau``:
    Gumbel-softmax temperature; ``epochs``, ``lr``, ``batch_size``: the fine-tuning of the
    prediction modules (AdamW, cosine schedule)."""

    keep: float = field(default=0.7, metadata={HELP: "keep ratio rho: stage s keeps ceil(rho^s * patches) tokens"})
    layers: tuple[int, ...] = field(default=(3, 6, 9), metadata={HELP: (
        "the blocks with a prediction module (one stage each, in order)")})
    ratio_weight: float = field(default=2.0, metadata={HELP: (
        "weight of the keep-ratio loss (the paper's lambda_ratio)")})
    tau: float = field(default=1.0, metadata={HELP: "Gumbel-softmax temperature"})
    epochs: int = field(default=1, metadata={HELP: (
        "fine-tuning epochs of the prediction modules (AdamW, cosine schedule)")})
    lr: float = field(default=1e-2, metadata={HELP: "fine-tuning learning rate"})
    batch_size: int = field(default=64, metadata={HELP: "images per training batch"})

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


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dynamicvit",
        kind="pruning",
        params=DynamicViTParams,
        build="vitbench_plugins.dynamicvit.reduction:build",
        families=("vit",),
        needs_training=True,
        # rho: the fraction of patch tokens kept per stage; counts (and GMACs) are fixed by it,
        # trained or not, so the knob can be searched on the untrained model
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="DynamicViT: learned prediction modules keep the top rho^s of the patch tokens "
                    "at each stage (trains the predictors with a keep-ratio loss)",
    ))
