"""K-Medoids token clustering merge, training-free (the clustering reduction evaluated beside
DPC-KNN by Haurum et al., "Which Tokens to Use? Investigating Token Reduction in Vision
Transformers", ICCV Workshops 2023; the algorithm: Voronoi iteration, Park & Jun 2009;
docs/methods.md, "K-Medoids").

At each listed block (after the attention residual, docs/methods.md, "The hook point") the ``N_p`` patch tokens
become ``M = ceil(keep * N_p)`` tokens: ``M`` medoids start evenly spread over the tokens in their
current order (deterministic), ``iters`` Voronoi steps move each medoid to its cluster's member
of least summed distance, and each final cluster becomes the size-weighted mean of its members.
``keep = 1`` changes nothing.

Parameters: ``keep``, ``layers``, ``iters``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class KMedoidsParams:
    """``keep``: clusters per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster; ``iters``: Voronoi iterations."""

    keep: float = param(0.5, "clusters per listed block, as a fraction of its patch tokens (1 changes nothing)",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "the blocks that cluster (0-based); None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)", range=Range(0))
    iters: int = param(3, "Voronoi iterations of the medoid search", range=Range(0))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="kmedoids",
        kind="merging",
        params=KMedoidsParams,
        build="vitbench_plugins.kmedoids.reduction:build",
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="K-Medoids: clustering merge of the patch tokens at listed blocks (Voronoi iteration, "
                    "size-weighted cluster means; training-free)",
    ))
