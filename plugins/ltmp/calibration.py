"""LTMP's calibration at matched compute (docs/methods.md, "LTMP", "Calibration").

Training moves the thresholds towards the budget, but a few SGD steps can leave them far from it.
After training, one scale ``alpha`` of every block's thresholds, ``theta_m = 1 - alpha (1 -
theta_m*)`` and ``theta_p = alpha theta_p*`` (``*`` the trained values, clamped to ``[0, 1]``), is
searched so that the mean cost of the first training images lands on the goal. ``alpha = 1`` is
the trained model, ``0`` reduces nothing, and a larger ``alpha`` reduces more: the blocks keep the
order training gave them, only how much they reduce changes together. A block trained to ``theta_m
= 1`` and ``theta_p = 0`` stays unreduced at any ``alpha``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["IMAGES", "calibrate", "mean_ratio", "scale_thresholds"]

log = logging.getLogger("vitbench.ltmp")

#: training images the calibration measures (the first ones of the training set, in order)
IMAGES = 256
#: the most search steps after the bracket
STEPS = 12
#: a mean cost within this fraction of the goal ends the search
TOLERANCE = 0.005
#: images per forward of the calibration
BATCH = 64

#: ``ratio_of(model, images)``: each image's cost ratio ``[B]`` of the eval forward just run
RatioOf = Callable[[nn.Module, int], torch.Tensor]


def scale_thresholds(reducers: Sequence[nn.Module], trained: Sequence[tuple[float, float]], alpha: float) -> None:
    """Set each reducer's ``theta_m`` to ``1 - alpha (1 - m)`` and ``theta_p`` to ``alpha p``,
    ``(m, p)`` its trained pair, both clamped to ``[0, 1]``."""
    with torch.no_grad():
        for reducer, (m, p) in zip(reducers, trained):
            reducer.theta_m.fill_(min(max(1.0 - alpha * (1.0 - m), 0.0), 1.0))
            reducer.theta_p.fill_(min(max(alpha * p, 0.0), 1.0))


def mean_ratio(model: nn.Module, images: torch.Tensor, ratio_of: RatioOf) -> float:
    """The mean over ``images`` of each image's cost ratio at the model's current thresholds."""
    total = 0.0
    with torch.no_grad():
        for chunk in images.split(BATCH):
            model(chunk)
            total += float(ratio_of(model, len(chunk)).double().sum())
    return total / len(images)


def _largest_scale(trained: Sequence[tuple[float, float]]) -> float:
    """The ``alpha`` at which the last threshold that can move saturates (1 if none can)."""
    ends = [1.0 / (1.0 - m) for m, _ in trained if m < 1.0] + [1.0 / p for _, p in trained if p > 0.0]
    return max([1.0, *ends])


def calibrate(model: nn.Module, reducers: Sequence[nn.Module], images: torch.Tensor, ratio_of: RatioOf,
              goal: float) -> dict[str, float]:
    """Search the scale ``alpha`` (module doc) until the mean cost ratio of ``images`` is within
    :data:`TOLERANCE` of ``goal``, by regula falsi on a bracket (the Illinois variant); leave the
    reducers at the best ``alpha`` measured. Returns it (``alpha``), its mean ratio (``ratio``),
    the trained thresholds' (``trained_ratio``), ``images`` and ``forwards``. ``model`` is in
    eval mode; a goal out of reach ends at the nearest end. ``alpha = 0`` is taken to cost the
    unreduced model (ratio 1) without measuring it."""
    trained = [(float(r.theta_m.detach()), float(r.theta_p.detach())) for r in reducers]
    tried: dict[float, float] = {}

    def miss(alpha: float) -> float:
        scale_thresholds(reducers, trained, alpha)
        tried[alpha] = mean_ratio(model, images, ratio_of)
        return tried[alpha] - goal

    lo, hi = 0.0, 1.0
    f_lo, f_hi = 1.0 - goal, miss(1.0)
    if f_hi > 0:  # the trained thresholds reduce too little
        lo, f_lo = hi, f_hi
        hi = _largest_scale(trained)
        f_hi = miss(hi) if hi > lo else f_lo
    side = 0
    for _ in range(STEPS):
        if min(abs(r - goal) for r in tried.values()) <= TOLERANCE * goal or f_hi > 0 or hi - lo < 1e-9:
            break
        alpha = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        f = miss(alpha)
        if f > 0:
            lo, f_lo = alpha, f
            f_hi = f_hi / 2 if side == 1 else f_hi  # Illinois: halve the end kept twice in a row
            side = 1
        else:
            hi, f_hi = alpha, f
            f_lo = f_lo / 2 if side == -1 else f_lo
            side = -1
    best = min(tried, key=lambda a: abs(tried[a] - goal))
    scale_thresholds(reducers, trained, best)
    level = logging.INFO if abs(tried[best] - goal) <= TOLERANCE * goal else logging.WARNING
    log.log(level, "ltmp: calibrated the thresholds by alpha=%.4g on %d training images in %d forwards: mean "
            "cost ratio %.4f (trained %.4f, goal %.4f)", best, len(images), len(tried), tried[best], tried[1.0], goal)
    return {"alpha": best, "ratio": tried[best], "trained_ratio": tried[1.0], "images": len(images),
            "forwards": len(tried)}
