"""LTM / IBTM: learnable token merging guided by the information bottleneck (the IBTM and LTM
papers, Sec. 3 and Algorithm 1; docs/methods.md, "LTM / IBTM" and "The IB loss").

One method, registered as ``ltm`` with the alias ``ibtm``. The authors' repository
(Statistical-Deep-Learning/LTM) holds their training harness and IB loss but no LTM model, so
the merge is ours (docs/methods.md, "LTM / IBTM" names each deviation). The first block merges the ``N_p``
patch tokens into ``P = ceil(ratio * N_p)`` with a learned soft mask (:class:`FirstMerge`);
every later block re-merges ``P -> P`` by one gradient step on the IB bound under a learned
binary mask (:class:`ReMerge`, :func:`ib_mask_step`). The cluster statistics are refreshed
around each epoch (:func:`refresh_statistics`); conv hybrids fold merges to a smaller map, Swin
merges each tile for the MLP (:class:`TileMerge`).

Parameters: ``ratio``, ``eta``, ``tau``, ``epochs``, ``lr``, ``mlp_lr``, ``ib_weight``, ``recipe``,
``clusters``, ``num_clusters``, ``batch_size``, ``mlp_ratio``, ``stats_images``, ``step_labels``,
``init``, ``trace_source``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.catalog import HELP, MethodSpec
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


OPTIMIZERS = ("SGD", "AdamW", "Adam")
STEP_LABELS = ("prior", "true")
#: the first merge's initialisation: ``runs`` (ViT), ``grid`` (pooling; conv hybrids' only), ``auto``
INITS = ("auto", "runs", "grid")
#: the fine-tuning recipe: ``tuned`` (ours, docs/methods.md, "LTM / IBTM") or ``official`` (the authors' code)
RECIPES = ("tuned", "official")
#: the ``clusters`` of the IB step and bound (:data:`vitbench.measure.clusters.CLUSTERS`)
CLUSTERS = ("class", "kmeans")


@dataclass(frozen=True)
class Recipe:
    """A fine-tuning recipe's IB weight, the share of the epochs before the IB term is on, and CE's
    label smoothing."""

    ib_weight: float
    ib_warmup: float
    label_smoothing: float


#: ``official``: the authors' harness (docs/methods.md, "LTM / IBTM" "Recipes"); ``tuned``: ours
RECIPE_VALUES = {"tuned": Recipe(1.0, 0.0, 0.0), "official": Recipe(0.1, 0.3, 0.1)}


@dataclass(frozen=True)
class LTMParams:
    """LTM/IBTM options (docs/methods.md, "LTM / IBTM"); each field's help says what it is."""

    ratio: float = field(default=0.7, metadata={HELP: (
        "P = ceil(ratio * N_p) tokens after the first block (the budget knob)")})
    eta: float = field(default=1.0, metadata={HELP: "step size of the IB gradient step in every later block"})
    tau: float = field(default=1.0, metadata={HELP: "Gumbel temperature of both masks"})
    epochs: int = field(default=2, metadata={HELP: (
        "fine-tuning epochs; the class statistics are refreshed between them")})
    lr: float = field(default=0.3, metadata={HELP: "AdamW's rate for M1, the M_l logits and the scales s_l"})
    mlp_lr: Optional[float] = field(default=0.0, metadata={HELP: (
        "rate of the IB step's per-block MLPs: 0 keeps them frozen, None: lr")})
    optimizer: str = field(default="AdamW", metadata={HELP: "the fine-tuning optimizer"})
    ib_weight: Optional[float] = field(default=None, metadata={HELP: (
        "weight of the IB bound in the loss (None: the recipe's; given, it overrides it)")})
    recipe: str = field(default="tuned", metadata={HELP: (
        "tuned (IB weight 1) or official (the authors': 0.1 after a 30 % warm-up, smoothing 0.1)")})
    clusters: str = field(default="class", metadata={HELP: (
        "the IB clusters: class centroids or k-means on features and inputs")})
    num_clusters: Optional[int] = field(default=None, metadata={HELP: (
        "k-means clusters (None: the class count)")})
    batch_size: int = field(default=64, metadata={HELP: "fine-tuning batch size"})
    mlp_ratio: float = field(default=0.25, metadata={HELP: (
        "hidden width of the per-block MLP as a share of the token width")})
    stats_images: int = field(default=2048, metadata={HELP: "training images per statistics pass (0: all)"})
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})
    step_labels: str = field(default="prior", metadata={HELP: (
        "log Q(a|y) in training: under the class prior (as at inference) or the true label")})
    init: str = field(default="auto", metadata={HELP: (
        "the first merge's initialisation: runs (ViT), grid (pooling), auto")})

    def __post_init__(self) -> None:
        checks = [
            ("ratio", 0.0 < self.ratio <= 1.0, "in (0, 1]"),
            ("eta", self.eta >= 0.0, ">= 0"),
            ("tau", self.tau > 0.0, "> 0"),
            ("epochs", self.epochs >= 0, "an integer >= 0"),
            ("lr", self.lr > 0.0, "> 0"),
            ("mlp_lr", self.mlp_lr is None or self.mlp_lr >= 0.0, ">= 0 (0: frozen; None: the same as lr)"),
            ("ib_weight", self.ib_weight is None or self.ib_weight >= 0.0, ">= 0 (None: the recipe's)"),
            ("num_clusters", self.num_clusters is None or self.num_clusters >= 1,
             "an integer >= 1 (None: the class count)"),
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
        if self.recipe not in RECIPES:
            raise ParamError(f"ltm.recipe={self.recipe!r} is not supported; valid: {', '.join(RECIPES)}")
        if self.clusters not in CLUSTERS:
            raise ParamError(f"ltm.clusters={self.clusters!r} is not supported; valid: {', '.join(CLUSTERS)}")
        if self.clusters == "class" and self.num_clusters is not None:
            raise ParamError(f"ltm.num_clusters={self.num_clusters!r} applies to clusters=kmeans only; valid "
                             f"with clusters=class: None (one cluster per class)")

    @property
    def schedule(self) -> Recipe:
        """The recipe's values, its IB weight replaced by ``ib_weight`` when given."""
        recipe = RECIPE_VALUES[self.recipe]
        if self.ib_weight is None:
            return recipe
        return Recipe(self.ib_weight, recipe.ib_warmup, recipe.label_smoothing)


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
