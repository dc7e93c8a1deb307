"""DCS: differentiable channel selection, searched then retrained with the IB bound (the DCS
paper; docs/methods.md, "DCS" and "The IB loss").

Channels, not tokens: one :class:`DCSReducer` per block acts through the channel hooks of
:class:`~vitbench.engine.Reducer`, with an input-dependent Q/K channel mask (``arch`` both|qk)
and architecture logits ``alpha`` gating the attention-output/MLP channels (``arch``
both|out), both straight-through Gumbel-sigmoid masks. Training: a search alternating weights
and ``alpha`` under a penalty towards a compute ``budget`` of the counted GMACs (then the
budget is enforced and the MLPs shrunk), and a retraining on ``CE + eta * IB bound``, whose
clusters are class centroids (``clusters=class``) or the paper's k-means with A = B = C
(``clusters=kmeans``). No public implementation exists: this is the reference.

Parameters: ``arch``, ``qk_mask``, ``budget``, ``lam``, ``tau0``, ``tau_decay``, ``search_epochs``,
``retrain_epochs``, ``t_warm``, ``eta``, ``clusters``, ``num_clusters``, ``lr``, ``arch_lr``,
``optimizer``, ``batch_size``. docs/methods.md, "DCS" gives each default and why."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, hookimpl


ARCHS = ("both", "qk", "out")
QK_MASKS = ("shared", "separate")
OPTIMIZERS = ("SGD", "AdamW", "Adam")
#: the IB bound's clusters: ``class`` centroids (ours) or ``kmeans`` (the paper's A = B = C)
CLUSTERS = ("class", "kmeans")


@dataclass(frozen=True)
class DCSParams:
    """DCS options (docs/methods.md, "DCS"); docs/methods.md, "DCS" gives the defaults' reasons."""

    arch: str = field(default="out", metadata={HELP: (
        "which channels are selected: out (MLP and proj), qk (Q/K masks), both")})
    qk_mask: str = field(default="shared", metadata={HELP: (
        "one Q/K channel mask shared by Q and K, or separate ones")})
    tau0: float = field(default=4.5, metadata={HELP: "the search's initial Gumbel temperature"})
    tau_decay: float = field(default=0.95, metadata={HELP: (
        "factor on the temperature after every search epoch")})
    budget: float = field(default=0.9, metadata={HELP: (
        "share of the baseline's GMACs to keep (the budget knob)")})
    lam: float = field(default=1.0, metadata={HELP: (
        "weight of the search's compute penalty while over budget")})
    search_epochs: int = field(default=1, metadata={HELP: "epochs of the channel search"})
    retrain_epochs: int = field(default=1, metadata={HELP: "epochs of retraining after the search"})
    t_warm: int = field(default=0, metadata={HELP: "retraining epochs before the IB term is on"})
    eta: float = field(default=1.0, metadata={HELP: "weight of the IB bound in the retraining loss"})
    clusters: str = field(default="class", metadata={HELP: (
        "the IB clusters: class centroids or k-means (the paper's A = B = C)")})
    num_clusters: Optional[int] = field(default=None, metadata={HELP: (
        "k-means clusters of the IB bound (None: the class count)")})
    lr: float = field(default=1e-3, metadata={HELP: "the weights' learning rate"})
    arch_lr: float = field(default=0.1, metadata={HELP: "the architecture logits' learning rate"})
    optimizer: str = field(default="AdamW", metadata={HELP: "the optimizer"})
    batch_size: int = field(default=64, metadata={HELP: "search and retraining batch size"})

    def __post_init__(self) -> None:
        for name, value, valid in (("arch", self.arch, ARCHS), ("qk_mask", self.qk_mask, QK_MASKS),
                                   ("optimizer", self.optimizer, OPTIMIZERS), ("clusters", self.clusters, CLUSTERS)):
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
        if self.num_clusters is not None and self.num_clusters < 1:
            raise ParamError(f"dcs.num_clusters={self.num_clusters} is out of range; it must be an integer >= 1 "
                             f"(None: the class count)")
        if self.clusters == "class" and self.num_clusters is not None:
            raise ParamError(f"dcs.num_clusters={self.num_clusters!r} applies to clusters=kmeans only; valid "
                             f"with clusters=class: None (one cluster per class)")
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
        needs_training=True,
        # the fraction of the baseline's GMACs to keep (enforced when the search ends): set to F
        budget=BudgetKnob("budget", larger_means="more", mode="fraction"),
        description="DCS: differentiable Q/K and MLP (EfficientViT: attention-output) channel "
                    "selection, searched then retrained with the IB bound (learnable)",
    ))
