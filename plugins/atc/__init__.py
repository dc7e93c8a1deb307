"""ATC: agglomerative token clustering, training-free (Haurum et al., *Agglomerative Token
Clustering*, ECCV 2024, Sec. 3; docs/methods.md, "ATC").

At each listed block, between the attention and the MLP (paper Sec. 3), the ``N_p`` patch tokens
become ``M = ceil(keep * N_p)`` tokens: bottom-up hierarchical clustering of the attention's
head-averaged keys under the cosine distance, with the ``single``, ``complete`` or ``average``
linkage (paper Sec. 3, Eq. 2-4), stopped at ``M`` clusters (scipy.cluster.hierarchy); each cluster
becomes the size-weighted mean of its members, and proportional attention follows (Sec. 3).
``keep = 1`` changes nothing.

Parameters: ``keep``, ``layers``, ``linkage``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param

#: the linkage functions of the paper (Sec. 3)
LINKAGES = ("average", "complete", "single")


@dataclass(frozen=True)
class ATCParams:
    """``keep``: clusters per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster (the paper's 4th, 7th and 10th); ``linkage``: the linkage function."""

    keep: float = param(0.5, "clusters per listed block, as a fraction of its patch tokens (1 changes nothing)",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "the blocks that cluster (0-based; the paper's 4th, 7th and 10th); None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)",
                                    range=Range(0))
    linkage: str = param("average", "the linkage of the hierarchical clustering: average, complete or single",
                         choices=LINKAGES)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="atc",
        kind="merging",
        params=ATCParams,
        build="vitbench_plugins.atc.reduction:build",
        # the fraction of patch tokens kept (as clusters) at each listed block
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="ATC: agglomerative (hierarchical) clustering merge of the patch tokens' keys at listed "
                    "blocks (single/complete/average linkage; training-free)",
    ))
