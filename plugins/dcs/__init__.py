"""DCS: differentiable channel selection, searched then retrained with the IB bound (the DCS
paper; docs/methods.md §7, the IB bound §6).

Channels, not tokens: one :class:`DCSReducer` per block acts through the channel hooks of
:class:`~vitbench.engine.Reducer`, with an input-dependent Q/K channel mask (``arch`` both|qk)
and architecture logits ``alpha`` gating the attention-output/MLP channels (``arch``
both|out), both straight-through Gumbel-sigmoid masks. Training is two stages: a search that
alternates weights and ``alpha`` under a penalty towards a compute ``budget`` of the counted
GMACs, after which the budget is enforced and the MLPs are shrunk; then a retraining on
``CE + eta * IB bound``. Family-specific parts (EfficientViT's LiteMLA reducer, the IB
features) come from the family adapters. No public implementation exists: this is the reference.

Parameters: ``arch``, ``qk_mask``, ``budget``, ``lam``, ``tau0``, ``tau_decay``,
``search_epochs``, ``retrain_epochs``, ``t_warm``, ``eta``, ``lr``, ``arch_lr``, ``optimizer``,
``batch_size``. docs/methods.md §7 gives each default and why."""
from __future__ import annotations

from dataclasses import dataclass

from vitbench.catalog import BudgetKnob, MethodSpec
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


ARCHS = ("both", "qk", "out")
QK_MASKS = ("shared", "separate")
OPTIMIZERS = ("SGD", "AdamW", "Adam")


@dataclass(frozen=True)
class DCSParams:
    """DCS options (docs/methods.md §7); docs/methods.md §7 gives the defaults' reasons."""

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


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dcs",
        kind="channel",
        params=DCSParams,
        build="vitbench_plugins.dcs.reduction:build",
        families=("vit", "efficientvit", "mobilevit", "swin"),
        needs_training=True,
        # the fraction of the baseline's GMACs to keep (enforced when the search ends): set to F
        budget=BudgetKnob("budget", larger_means="more", mode="fraction"),
        description="DCS: differentiable Q/K and MLP (EfficientViT: attention-output) channel "
                    "selection, searched then retrained with the IB bound (learnable)",
    ))
