"""LTM / IBTM: learnable token merging guided by the information bottleneck (the IBTM and LTM
papers, §3 and Algorithm 1; docs/methods.md §5, the IB bound §6).

One method, registered as ``ltm`` with the alias ``ibtm``; no public implementation exists, so
this is the reference. The first block merges the ``N_p`` patch tokens into
``P = ceil(ratio * N_p)`` with a learned soft mask (:class:`FirstMerge`); every later block
re-merges ``P -> P`` by one gradient step on the IB bound under a learned binary mask
(:class:`ReMerge`, :func:`ib_mask_step`); sizes and sources follow each token's row shares,
without gradient. The class statistics the step needs are refreshed around each epoch
(:func:`refresh_statistics`). On conv hybrids merges fold to a smaller map, on Swin each tile
is merged for the MLP and unmerged after it (:class:`TileMerge`).

Parameters: ``ratio``, ``eta``, ``tau``, ``epochs``, ``lr``, ``mlp_lr``, ``ib_weight``,
``batch_size``, ``mlp_ratio``, ``stats_images``, ``step_labels``, ``init``, ``trace_source``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.catalog import MethodSpec
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


OPTIMIZERS = ("SGD", "AdamW", "Adam")
STEP_LABELS = ("prior", "true")
#: the first merge's initialisation: ``runs`` (ViT), ``grid`` (pooling; conv hybrids' only), ``auto``
INITS = ("auto", "runs", "grid")


@dataclass(frozen=True)
class LTMParams:
    """``ratio``: P = ceil(ratio * N_p) tokens after block 1; ``eta``: the IB step size;
    ``tau``: Gumbel temperature of both masks; ``ib_weight``: weight of the IB bound in the
    loss; ``mlp_ratio``: hidden width of the per-block MLP / C; ``stats_images``: training
    images per statistics pass (0: all)."""

    ratio: float = 0.7
    eta: float = 1.0
    tau: float = 1.0
    #: fine-tuning epochs; the statistics are refreshed between them (docs/methods.md §5)
    epochs: int = 2
    #: AdamW's rate for ``M1``, the ``M_l`` logits and the scales ``s_l`` (large: logits live in nats)
    lr: float = 0.3
    #: the IB step's per-block MLPs: 0 keeps them frozen (stale clusters otherwise), ``None``: ``lr``
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


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="ltm",
        kind="merging",
        params=LTMParams,
        build="vitbench_plugins.ltm.reduction:build",
        families=("vit", "mobilevit", "swin"),
        aliases=("ibtm",),
        needs_training=True,
        # P = ceil(ratio * N_p) tokens: the count is fixed by ratio, so it is searched before training
        budget=dict(param="ratio", larger_means="more", low=0.001, high=1.0),
        description="LTM/IBTM: learnable token merging by one IB-bound gradient step per block "
                    "(P = ceil(ratio * N_p) tokens after block 1; fine-tuned masks)",
    ))
