"""LTMP: learned thresholds for token merging and pruning (Bonnaerens & Dambre, 2023;
docs/methods.md, "LTMP").

Every reducing block owns two scalar thresholds, the only parameters that train. After the
attention residual (docs/methods.md, "The hook point") it merges each A token into its most similar B token
(ToMe's bipartite split, cosine of the keys) when the similarity exceeds ``theta_m``, then
prunes tokens whose received attention is at most ``theta_p``. In training tokens are masked,
not removed (straight-through masks, key bias ``log(mask + 1e-6)``) and the loss adds
``lambda * (flops_ratio - target)^2``; at inference tokens are removed and a batch is padded to
its largest count. On Swin (:class:`LTMPTileReducer`) the thresholds act per tile for the MLP.

Parameters: ``target`` (or ``gmacs_fraction`` at matched compute), ``tau``, ``lambda_flops``,
``epochs``, ``lr_merge``, ``lr_prune``, ``max_grad``, ``optimizer``, ``label_smoothing``,
``batch_size``, ``layers``, ``order`` (``bipartite``, the official layout, or ``original``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.catalog import HELP, BudgetKnob, MethodSpec
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


_OPTIMIZERS = ("SGD", "AdamW", "Adam")
#: layouts of the tokens after a reducing block (docs/methods.md, "LTMP", "Token layout")
ORDERS = ("bipartite", "original")


@dataclass(frozen=True)
class LTMPParams:
    """``target``: FLOPs ratio to reach (Swin: a fraction of the counted GMACs); ``tau``: masker
    temperature; ``lambda_flops``: weight of the FLOPs penalty; ``lr_merge``/``lr_prune``:
    learning rates of ``theta_m``/``theta_p``; ``layers``: the blocks that reduce (``None``:
    all); ``order``: the token layout after a reducing block (``"bipartite"``: prefix, set A,
    set B, as the official code; ``"original"``: the original order); ``gmacs_fraction``:
    matched compute (``--match-gmacs F`` sets it to ``F``): the fraction of the model's counted GMACs to reach. ``None``
    (default): the penalty measures the paper's FLOPs ratio against ``target``; set: it measures
    the model's exact cost (:class:`CostModel`, as ``vitbench.measure.count_gmacs`` counts it)
    against ``gmacs_fraction``, and ``target`` is not used. ``max_grad``: the bound on each
    threshold's gradient per step (``None``: unbounded, as the paper), so one step moves a
    threshold by at most ``lr * max_grad`` (docs/methods.md, "LTMP", "Thresholds")."""

    target: float = field(default=0.75, metadata={HELP: (
        "FLOPs ratio to reach (Swin: a fraction of the counted GMACs); unused with gmacs_fraction")})
    tau: float = field(default=0.1, metadata={HELP: "temperature of the learned thresholds' maskers"})
    lambda_flops: float = field(default=10.0, metadata={HELP: "weight of the FLOPs penalty"})
    epochs: int = field(default=1, metadata={HELP: "fine-tuning epochs of the thresholds"})
    lr_merge: float = field(default=5e-3, metadata={HELP: "learning rate of the merging thresholds theta_m"})
    lr_prune: float = field(default=5e-6, metadata={HELP: "learning rate of the pruning thresholds theta_p"})
    max_grad: Optional[float] = field(default=10.0, metadata={HELP: (
        "bound on each threshold's gradient per step (None: unbounded, as the paper)")})
    optimizer: str = field(default="SGD", metadata={HELP: "the fine-tuning's optimizer: SGD, AdamW or Adam"})
    label_smoothing: float = field(default=0.1, metadata={HELP: "label smoothing of the cross-entropy"})
    batch_size: int = field(default=64, metadata={HELP: "images per training batch"})
    layers: Optional[tuple[int, ...]] = field(default=None, metadata={HELP: (
        "the blocks that reduce (0-based; None: all)")})
    order: str = field(default="bipartite", metadata={HELP: (
        "token layout after a reducing block: bipartite (prefix, A, B) or original")})
    gmacs_fraction: Optional[float] = field(default=None, metadata={HELP: (
        "fraction of the counted GMACs to reach (--match-gmacs sets it; None: use target)")})

    def __post_init__(self) -> None:
        if not 0.0 < self.target <= 1.0:
            raise ParamError(f"ltmp.target={self.target} is out of range; the FLOPs ratio must be in (0, 1]")
        if self.gmacs_fraction is not None and not 0.0 < self.gmacs_fraction <= 1.0:
            raise ParamError(f"ltmp.gmacs_fraction={self.gmacs_fraction} is out of range; the fraction of "
                             f"the model's GMACs must be in (0, 1]")
        if not self.tau > 0.0:
            raise ParamError(f"ltmp.tau={self.tau} is out of range; the temperature must be > 0")
        if not self.lambda_flops >= 0.0:
            raise ParamError(f"ltmp.lambda_flops={self.lambda_flops} is out of range; it must be >= 0")
        if self.epochs < 1:
            raise ParamError(f"ltmp.epochs={self.epochs} is out of range; it must be >= 1")
        for name in ("lr_merge", "lr_prune"):
            if not getattr(self, name) >= 0.0:
                raise ParamError(f"ltmp.{name}={getattr(self, name)} is out of range; it must be >= 0")
        if self.max_grad is not None and not self.max_grad > 0.0:
            raise ParamError(f"ltmp.max_grad={self.max_grad} is out of range; it must be > 0 (or None: unbounded)")
        if self.optimizer not in _OPTIMIZERS:
            raise ParamError(f"ltmp.optimizer={self.optimizer!r}; valid optimizers: {', '.join(_OPTIMIZERS)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ParamError(f"ltmp.label_smoothing={self.label_smoothing} is out of range; "
                             f"it must be in [0, 1)")
        if self.batch_size < 1:
            raise ParamError(f"ltmp.batch_size={self.batch_size} is out of range; it must be >= 1")
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            raise ParamError(f"ltmp.layers={list(self.layers)}: block indices are >= 0")
        if self.order not in ORDERS:
            raise ParamError(f"ltmp.order={self.order!r}; valid orders: {', '.join(ORDERS)}")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="ltmp",
        kind="hybrid",
        params=LTMPParams,
        build="vitbench_plugins.ltmp.reduction:build",
        families=("vit", "swin"),
        needs_training=True,
        needs_attention_probs=True,
        # matched compute sets gmacs_fraction = F: the penalty then measures the counted cost
        # (CostModel), not the paper's ratio, whose target lands off F (flops_penalty_of)
        budget=BudgetKnob("gmacs_fraction", larger_means="more", mode="fraction"),
        description="LTMP: learned per-block thresholds for token merging and pruning "
                    "(trains only the thresholds)",
    ))
