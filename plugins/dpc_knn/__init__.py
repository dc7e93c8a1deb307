"""DPC-KNN token clustering merge, training-free (TCFormer, Zeng et al., CVPR 2022, Sec. 3.2
"Clustering-based Token Merge"; density peaks clustering of Rodriguez & Laio, Science 2014,
with a k-nearest-neighbour density; docs/methods.md, "DPC-KNN").

At each listed block (after the attention residual, docs/methods.md, "The hook point") the ``N_p`` patch tokens
are clustered into ``M = ceil(keep * N_p)`` clusters: the ``M`` tokens with the largest
``rho * delta`` (kNN density times the distance to the nearest denser token) are the centres,
every token joins its nearest centre, and each cluster becomes the size-weighted mean of its
members (sizes stand in for TCFormer's learned importance). Density ties break by position, so
the method is deterministic. ``keep = 1`` changes nothing.

Parameters: ``keep``, ``layers``, ``k`` (neighbours of the density)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class DPCKNNParams:
    """``keep``: clusters per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster; ``k``: neighbours of the density estimate (TCFormer: 5)."""

    keep: float = param(0.5, "clusters per listed block, as a fraction of its patch tokens (1 changes nothing)",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "the blocks that cluster (0-based); None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)", range=Range(0))
    k: int = param(5, "neighbours of the kNN density estimate (TCFormer: 5)", range=Range(1))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dpc-knn",
        kind="merging",
        params=DPCKNNParams,
        build="vitbench_plugins.dpc_knn.reduction:build",
        # the fraction of patch tokens kept (as clusters) at each listed block
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="DPC-KNN: density-peaks clustering merge of the patch tokens at listed blocks (TCFormer's CTM, "
                    "training-free)",
    ))
