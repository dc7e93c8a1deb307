"""The controls: what a method must beat to be worth its code (docs/methods.md, "Controls").

- ``random`` drops patch tokens chosen at random, at the schedule ``topk`` uses: ``keep`` of the
  patch tokens at each of ``layers`` (by default a quarter, half and three quarters of the depth). The positions come from the run's seed (``--seed``), the
  same in every image, so an image's result does not depend on its batch; ``--seeds`` draws others.
- ``downsample`` feeds the model a smaller image: each input resized to a grid of about ``keep``
  x the patch tokens, the position embedding resampled to it (on Swin the windows scaled with
  the grid, whose sides stay multiples of ``2 ** (stages - 1)`` patches) (Haurum et al., "Which
  Tokens to Use?", ICCVW 2023, and the VLM benchmarks after it found both hard to beat).

Both are matched like any method (``--match-gmacs``, ``vitbench sweep``) by ``keep``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class RandomParams:
    """``keep`` fraction of patch tokens kept, at random, at each of ``layers`` (top-k's (3, 6, 9)
    on 12 blocks, the same fractions of the depth on others, so a sweep can add it to any ViT)."""

    keep: float = param(0.7, "fraction of patch tokens kept at each listed block, in (0, 1]",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "blocks (0-indexed) that drop tokens; None: at a quarter, "
                                                    "half and three quarters of the depth ((3, 6, 9) of 12)",
                                              range=Range(0))


@dataclass(frozen=True)
class DownsampleParams:
    """``keep``: the smaller image's patch tokens as a fraction of the model's."""

    keep: float = param(0.7, "patch tokens of the smaller image as a fraction of the model's, in (0, 1]: "
                             "the largest grid of the model's shape with at most that many",
                        range=Range(0, 1, low_open=True))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="random",
        kind="control",
        params=RandomParams,
        build="vitbench_plugins.controls.reduction:build_random",
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="control: drop patch tokens at random (the run's seed) at top-k's schedule",
    ))
    register(MethodSpec(
        name="downsample",
        kind="control",
        params=DownsampleParams,
        build="vitbench_plugins.controls.reduction:build_downsample",
        needs=frozenset({"smaller_input"}),
        # whole patches: where no grid lands within the tolerance, the nearest under the budget
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0, coarse="below"),
        description="control: a smaller image, the position embedding resampled to it",
    ))
