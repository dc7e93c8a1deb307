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

from dataclasses import dataclass
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class DynamicViTParams:
    """``keep``: the paper's keep ratio ``rho`` (stage ``s`` keeps ``ceil(rho^s N_p)`` patches);
    ``layers``: the blocks with a prediction module (one stage each, in order);
    ``ratio_weight``: weight of the keep-ratio loss (the paper's ``lambda_ratio``); ``tau``:
    Gumbel-softmax temperature; ``epochs``, ``lr``, ``batch_size``: the fine-tuning of the
    prediction modules (AdamW, cosine schedule)."""

    keep: float = param(0.7, "keep ratio rho: stage s keeps ceil(rho^s * patches) tokens",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "the blocks with a prediction module (one stage each, in order); None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)",
                                    range=Range(0))
    ratio_weight: float = param(2.0, "weight of the keep-ratio loss (the paper's lambda_ratio)", range=Range(0))
    tau: float = param(1.0, "Gumbel-softmax temperature", range=Range(0, low_open=True), why="the temperature")
    epochs: int = param(1, "fine-tuning epochs of the prediction modules (AdamW, cosine schedule)", range=Range(1))
    lr: float = param(1e-2, "fine-tuning learning rate", range=Range(0, low_open=True))
    batch_size: int = param(64, "images per training batch", range=Range(1))

    def __post_init__(self) -> None:
        if self.layers is not None and len(self.layers) == 0:
            raise ParamError("dynamicvit.layers=[] is out of range; it must list at least one block")
        if self.layers is not None and len(set(self.layers)) != len(self.layers):
            raise ParamError(f"dynamicvit.layers={list(self.layers)} is out of range; each block may "
                             f"be listed once")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dynamicvit",
        kind="pruning",
        params=DynamicViTParams,
        build="vitbench_plugins.dynamicvit.reduction:build",
        needs=frozenset({"token_steps", "one_width"}),
        needs_training=True,
        # rho: the fraction of patch tokens kept per stage; counts (and GMACs) are fixed by it,
        # trained or not, so the knob can be searched on the untrained model
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="DynamicViT: learned prediction modules keep the top rho^s of the patch tokens "
                    "at each stage (trains the predictors with a keep-ratio loss)",
    ))
