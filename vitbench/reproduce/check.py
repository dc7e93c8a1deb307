"""A recipe's GMACs on random weights against its source's GFLOPs (``vitbench reproduce --check-gmacs``).

The model is timm's at ``pretrained=False`` (nothing downloads), seeded as ``vitbench run``
builds it; the method is applied untrained and counted with :func:`vitbench.measure.count_gmacs`,
the counter of ``vitbench run --metrics gmacs``, on seeded standard-normal images of the model's
input size (as the cls task counts without data). A row is ``ok`` within :data:`TOLERANCE` of
the source, ``off`` outside it, or ``explained`` / ``not counted`` with the recipe's reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from vitbench.reproduce.recipes import Recipe
from vitbench.host.values import values_of

__all__ = ["TOLERANCE", "GmacsCheck", "check_gmacs", "validated_params"]

#: relative distance from the source's GFLOPs that counts as a match
TOLERANCE = 0.02
#: seeded random images a row is counted on (their mean; input-dependent choices see each one)
IMAGES = 2


@dataclass(frozen=True)
class GmacsCheck:
    """One row's outcome: the counted GMACs (and baseline's, for a fraction), and the verdict."""

    recipe: Recipe
    #: ``ok``, ``off``, ``explained`` (counted, not held to the tolerance) or ``not counted``
    status: str
    gmacs: Optional[float] = None
    baseline_gmacs: Optional[float] = None

    @property
    def measured(self) -> Optional[float]:
        """What is compared: the GMACs, or their fraction of the baseline's for a fraction row."""
        if self.gmacs is None:
            return None
        if self.recipe.paper_gflops is None and self.recipe.paper_fraction is not None:
            return None if self.baseline_gmacs is None else self.gmacs / self.baseline_gmacs
        return self.gmacs

    @property
    def reference(self) -> Optional[float]:
        """The source's value ``measured`` is compared with."""
        return self.recipe.paper_gflops if self.recipe.paper_gflops is not None else self.recipe.paper_fraction

    @property
    def difference(self) -> Optional[float]:
        """``measured / reference - 1``; ``None`` when either is missing."""
        if self.measured is None or not self.reference:
            return None
        return self.measured / self.reference - 1


def validated_params(r: Recipe) -> Any:
    """The recipe's parameters as its method's validated parameter dataclass (a bad one raises
    :class:`~vitbench.errors.ParamError` naming it)."""
    return values_of(r.method, dict(r.params))


def check_gmacs(r: Recipe, images: int = IMAGES, seed: int = 0) -> GmacsCheck:
    """Count ``r`` on random weights and compare with its source (see the module docstring)."""
    values = validated_params(r)
    if not r.count:
        return GmacsCheck(r, "not counted")
    import torch

    import vitbench
    # torch: when a GMACs check runs; `reproduce --list` stays light
    from vitbench.measure import count_gmacs
    from vitbench.tasks.models import load_model
    from vitbench.tasks.common import input_size_of

    model = load_model(r.model, num_classes=r.num_classes, seed=seed)
    size = input_size_of(model)
    batch = torch.randn(images, *size, generator=torch.Generator().manual_seed(seed))
    baseline = count_gmacs(model, batch).mean if r.paper_gflops is None and r.paper_fraction else None
    reduced = vitbench.apply(model, r.method, values)
    gmacs = count_gmacs(reduced, batch).mean
    counted = GmacsCheck(r, "ok", gmacs, baseline)
    if r.gmacs_reason:
        return GmacsCheck(r, "explained", gmacs, baseline)
    off = counted.difference is None or abs(counted.difference) > TOLERANCE
    return GmacsCheck(r, "off" if off else "ok", gmacs, baseline)
