"""GMACs of LTM/IBTM on Swin-T at several ratios and class counts (issue 12; docs/results.md, "Swin").

    python benchmarks/swin_ltm_gmacs.py

``swin_tiny_patch4_window7_224`` with random weights (nothing is downloaded), counted with
:func:`vitbench.measure.flops.count_gmacs_at` on one 224-px input: the baseline, LTM at ratios
0.7 (its default), 0.6 and 0.5 before any statistics, and at 0.7 with the statistics buffers
of 10 and 1000 classes (random values of the right shapes: only their size changes the MACs of
the IB step, which measures each tile's distances to every class centroid).
"""
from __future__ import annotations

import copy

import timm
import torch
from vitbench_plugins.ltm.reduction import TileMerge

import vitbench
from vitbench.measure.flops import count_gmacs_at


def with_statistics(model: torch.nn.Module, classes: int) -> torch.nn.Module:
    """``model`` with every tile merge's statistics sized for ``classes`` classes."""
    for merge in (m for m in model.modules() if isinstance(m, TileMerge)):
        merge.centroids = torch.randn(classes, merge.p, merge.mlp[0].normalized_shape[0])
        merge.log_q = torch.randn(classes, classes).log_softmax(1)
        merge.class_prior = torch.full((classes,), 1.0 / classes)
    return model


def main() -> None:
    torch.manual_seed(0)
    base = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    print(f"baseline: {count_gmacs_at(base).mean:.3f} GMACs")
    for ratio in (0.7, 0.6, 0.5):
        model = vitbench.apply(copy.deepcopy(base), "ltm", ratio=ratio)
        print(f"ltm ratio={ratio}, no statistics: {count_gmacs_at(model).mean:.3f} GMACs")
        if ratio == 0.7:
            for classes in (10, 1000):
                gmacs = count_gmacs_at(with_statistics(model, classes)).mean
                print(f"ltm ratio=0.7, {classes}-class statistics: {gmacs:.3f} GMACs")


if __name__ == "__main__":
    main()
