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

Parameters: ``ratio``, ``eta``, ``ib_step``, ``tau``, ``epochs``, ``lr``, ``mlp_lr``, ``ib_weight``, ``recipe``,
``clusters``, ``num_clusters``, ``batch_size``, ``mlp_ratio``, ``stats_images``, ``step_labels``,
``init``, ``trace_source``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import HELP, MethodSpec, Range, hookimpl, param


OPTIMIZERS = ("SGD", "AdamW", "Adam")
STEP_LABELS = ("prior", "true")
#: the first merge's initialisation: ``runs`` (ViT), ``grid`` (pooling; conv hybrids' only), ``auto``
INITS = ("auto", "runs", "grid")
#: the fine-tuning recipe: ``tuned`` (ours, docs/methods.md, "LTM / IBTM") or ``official`` (the authors' code)
RECIPES = ("tuned", "official")
#: the ``clusters`` of the IB step and bound (:data:`vitbench.measure.clusters.CLUSTERS`)
CLUSTERS = ("class", "kmeans")
#: where the later blocks' IB step runs (docs/methods.md, "Readings: where the IB step runs")
IB_STEPS = ("train", "always")


@dataclass(frozen=True)
class Recipe:
    """A fine-tuning recipe: the IB weight, the share of the epochs before the IB term is on, CE's
    label smoothing, AdamW's rates (masks and scales; the IB step's MLPs, 0: frozen), weight
    decay, the cosine floor as a share of ``lr``, and the moving-average decay of the evaluated
    weights (None: the last step's)."""

    ib_weight: float
    ib_warmup: float
    label_smoothing: float
    lr: float
    mlp_lr: float
    weight_decay: float = 0.0
    min_lr_ratio: float = 0.01
    ema_decay: Optional[float] = None


#: ``official``: the authors' harness (docs/methods.md, "LTM / IBTM" "Recipes"); ``tuned``: ours
RECIPE_VALUES = {
    "tuned": Recipe(ib_weight=1.0, ib_warmup=0.0, label_smoothing=0.0, lr=0.3, mlp_lr=0.0),
    "official": Recipe(ib_weight=0.1, ib_warmup=0.3, label_smoothing=0.1, lr=2e-4, mlp_lr=2e-4,
                       weight_decay=0.01, min_lr_ratio=0.1, ema_decay=0.9995),
}


@dataclass(frozen=True)
class LTMParams:
    """LTM/IBTM options (docs/methods.md, "LTM / IBTM"); each field's help says what it is."""

    ratio: float = param(0.7, "P = ceil(ratio * N_p) tokens after the first block (the budget knob)",
                         range=Range(0, 1, low_open=True))
    eta: float = param(1.0, "step size of the IB gradient step in every later block", range=Range(0))
    ib_step: str = param("train",
                         "where the IB step runs: train (fine-tuning only; inference merges by the learned "
                         "masks alone) or always (fine-tuning and inference)", choices=IB_STEPS,
                         inference_only=True)
    tau: float = param(1.0, "Gumbel temperature of both masks", range=Range(0, low_open=True))
    epochs: int = param(1, "fine-tuning epochs; the class statistics are refreshed between them", range=Range(0))
    lr: Optional[float] = param(None, "AdamW's rate for M1, the M_l logits and the scales s_l (None: the "
                                "recipe's, tuned 0.3, official 2e-4)", range=Range(0, low_open=True),
                                why="None: the recipe's")
    mlp_lr: Optional[float] = param(None, "rate of the IB step's per-block MLPs, 0 keeps them frozen (None: the "
                                    "recipe's, tuned 0, official 2e-4)", range=Range(0), why="None: the recipe's")
    optimizer: str = param("AdamW", "the fine-tuning optimizer", choices=OPTIMIZERS)
    ib_weight: Optional[float] = param(None,
                                       "weight of the IB bound in the loss (None: the recipe's; given, it overrides it)",
                                       range=Range(0), why="None: the recipe's")
    recipe: str = param("tuned",
                        "tuned (IB weight 1, lr 0.3, frozen MLPs) or official (the authors' harness: IB 0.1 "
                        "after 30 % of the epochs, smoothing 0.1, AdamW 2e-4 for all, EMA 0.9995)",
                        choices=RECIPES)
    clusters: str = param("class", "the IB clusters: class centroids or k-means on features and inputs",
                          choices=CLUSTERS)
    num_clusters: Optional[int] = param(None, "k-means clusters (None: the class count)", range=Range(1),
                                        why="None: the class count")
    batch_size: int = param(64, "fine-tuning batch size", range=Range(1))
    mlp_ratio: float = param(0.25, "hidden width of the per-block MLP as a share of the token width",
                             range=Range(0, low_open=True))
    stats_images: int = param(2048, "training images per statistics pass (0: all)", range=Range(0),
                              why="0: all training images")
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})
    step_labels: str = param("prior",
                             "log Q(a|y) in training: under the class prior (as at inference) or the true label",
                             choices=STEP_LABELS)
    init: str = param("auto", "the first merge's initialisation: runs (ViT), grid (pooling), auto", choices=INITS)

    def __post_init__(self) -> None:
        if self.clusters == "class" and self.num_clusters is not None:
            raise ParamError(f"ltm.num_clusters={self.num_clusters!r} applies to clusters=kmeans only; valid "
                             f"with clusters=class: None (one cluster per class)")

    @property
    def schedule(self) -> Recipe:
        """The recipe's values, with ``ib_weight``, ``lr`` and ``mlp_lr`` in their place when given."""
        given = {"ib_weight": self.ib_weight, "lr": self.lr, "mlp_lr": self.mlp_lr}
        return dataclasses.replace(RECIPE_VALUES[self.recipe], **{k: v for k, v in given.items() if v is not None})


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="ltm",
        kind="merging",
        params=LTMParams,
        build="vitbench_plugins.ltm.reduction:build",
        needs=frozenset({"grid_merges"}),
        aliases=("ibtm",),
        needs_training=True,
        weights="vitbench_plugins.ltm:weights",  # fine-tuned 1 epoch on the default model's 60,000 images
        # P = ceil(ratio * N_p) tokens: the count is fixed by ratio, so it is searched before training
        budget=dict(param="ratio", larger_means="more", low=0.001, high=1.0),
        description="LTM/IBTM: learnable token merging by one IB-bound gradient step per block "
                    "(P = ceil(ratio * N_p) tokens after block 1; fine-tuned masks)",
    ))
