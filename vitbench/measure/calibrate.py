"""Matched compute: set a method's budget knob so that its GMACs land within :data:`TOLERANCE`
of ``F`` x the baseline's (``vitbench run --match-gmacs F``, ``vitbench sweep``; docs/measuring.md,
"Matched compute").

A method declares its knob in its :class:`~vitbench.catalog.MethodSpec` (``budget``, a
:class:`~vitbench.catalog.BudgetKnob`). Knobs of mode ``"search"`` are searched on the real count
(monotone in the knob) by false position, safeguarded by bisection (integer knobs rounded to a
setting inside the bracket); each count goes through a :class:`GmacsCounter`, which caches it,
so the searches of several budgets on one model never count a setting twice.
Knobs of mode ``"fraction"`` are the fraction itself (DCS's budget, LTMP's gmacs_fraction): they
are set to ``F`` and the count after fine-tuning says how far the method landed.

A learnable method with a searched knob (LTM) is counted as zero epochs of fine-tuning leave it
(:func:`prepared_as_trained`): what its stages prepare before training (LTM's class statistics,
whose IB step costs MACs in every later block) is part of what the trained model costs.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo
from vitbench.core.option_values import check_fraction
from vitbench.core.params import checked, params_json
from vitbench.errors import BudgetError
from vitbench.engine import reduction_context

__all__ = ["TOLERANCE", "Calibration", "GmacsCounter", "calibrate", "check_fraction",
           "not_matchable", "prepared_as_trained", "search_knob"]

#: how far (relative) a matched method's GMACs may land from ``F`` x the baseline's
TOLERANCE = 0.02
#: search a float knob until this close to the target, then round to the fewest decimals as close
_FLOAT_AIM = TOLERANCE / 4
_FLOAT_STEP = 1e-4
_DIGITS = 4  # float knob values are rounded to this many decimals (readable labels)


def prepared_as_trained(model: nn.Module, images: torch.Tensor) -> nn.Module:
    """``model`` (reduced by a learnable method) as zero epochs of fine-tuning leave it: each
    training stage's ``before`` callbacks (eval mode, no gradients), then its ``after`` ones,
    given ``images`` with labels cycled over the model's classes as the training data. What
    they build (LTM: class centroids sized by the class count, which its IB step runs against)
    depends on shapes, not on which images or labels; a model without training stages is
    returned as it is."""
    ctx = reduction_context(model)
    if ctx is None or ctx.reduction is None or not ctx.reduction.train:
        return model
    classes = int(getattr(model, "num_classes", 0) or 1)
    labels = torch.arange(images.shape[0]) % classes

    def batches():  # type: ignore[no-untyped-def]
        return iter([(images, labels)])

    was_training = model.training
    for stage in ctx.reduction.train:
        model.eval()
        with torch.no_grad():
            for callback in stage.before:
                callback(model, batches)
        for callback in stage.after:
            callback(model)
    model.train(was_training)
    return model


class GmacsCounter:
    """GMACs of the model reduced by ``(method, values)`` (its parameter dataclass) on fixed
    images, each setting counted once. ``count(None, None)`` is the unreduced baseline."""

    def __init__(self, count: Callable[[Optional[str], Any], float]) -> None:
        self._count = count
        self._cache: dict[tuple[Optional[str], str], float] = {}

    def __call__(self, method: Optional[str], values: Any) -> float:
        key = (method, "" if values is None else params_json(values))
        if key not in self._cache:
            self._cache[key] = float(self._count(method, values))
        return self._cache[key]

    @property
    def counted(self) -> int:
        """How many settings were really counted (the rest came from the cache)."""
        return len(self._cache)


@dataclass
class Calibration:
    """The knob value chosen for one method at one budget, and what it was aimed at."""

    method: str
    param: str
    value: Any
    mode: str
    fraction: float
    baseline_gmacs: float
    target_gmacs: float
    calibrated_gmacs: Optional[float] = None  # search: the count at ``value``
    counts: int = 0  # settings the search evaluated (counted or cached)
    values: Any = None  # the method's parameter dataclass, the knob set

    @property
    def params(self) -> dict[str, Any]:
        """:attr:`values` as the run's record holds them (canonical JSON values, sorted)."""
        return json.loads(params_json(self.values))

    def record(self) -> dict[str, Any]:
        """The ``budget`` field of the run's record."""
        out = {"fraction": self.fraction, "param": self.param, "value": self.value, "mode": self.mode,
               "baseline_gmacs": self.baseline_gmacs, "target_gmacs": self.target_gmacs,
               "tolerance_pct": 100 * TOLERANCE, "counts": self.counts}
        if self.calibrated_gmacs is not None:
            out.update(calibrated_gmacs=self.calibrated_gmacs,
                       calibrated_off_pct=off_pct(self.calibrated_gmacs, self.target_gmacs))
        return out


def off_pct(gmacs: float, target: float) -> float:
    """How far ``gmacs`` is from ``target``, in % of the target (signed)."""
    return 100.0 * (gmacs / target - 1.0)


def _fmt_value(param: str, value: Any) -> str:
    return f"{param}={json.dumps(value, separators=(',', ':'))}"


def search_knob(count: Callable[[Any], float], knob: BudgetKnob, low: float, high: float, target: float,
                *, method: str, depth: int = 1, tolerance: float = TOLERANCE,
                baseline: Optional[float] = None) -> tuple[Any, float, int]:
    """Search ``knob`` over ``[low, high]`` until ``count(value)`` lands within ``tolerance`` of
    ``target``; returns ``(value, count, settings evaluated)``.

    ``count`` must be monotone in the knob (non-increasing when ``knob.larger_means == "less"``).
    A target below the fewest GMACs the knob reaches (or above the most) raises a
    :class:`BudgetError` saying the range the method can reach; so does a target that falls
    between two neighbouring integer settings, both further than ``tolerance`` from it.
    ``baseline`` (the unreduced count) lets the messages speak in fractions of it."""
    seen: dict[str, tuple[Any, float]] = {}

    def c(value: Any) -> float:
        key = json.dumps(value)
        if key not in seen:
            seen[key] = (value, count(value))
        return seen[key][1]

    def within(g: float) -> bool:
        return abs(g - target) <= tolerance * target

    if knob.integer:
        low, high = int(math.ceil(low)), int(math.floor(high))
    else:
        low, high = round(low, _DIGITS), round(high, _DIGITS)
    most, least = (high, low) if knob.larger_means == "more" else (low, high)
    c_most, c_least = c(most), c(least)
    if c_least > target * (1 + tolerance) or c_most < target * (1 - tolerance):
        low_end = c_least > target
        end, g = (least, c_least) if low_end else (most, c_most)
        reach = g / (1 + tolerance) if low_end else g / (1 - tolerance)
        if baseline:
            asked = f"F = {target / baseline:.4g} ({target:.4g} GMACs)"
            valid = f"valid budgets for {method} here: F {'>=' if low_end else '<='} {reach / baseline:.3f}"
            g_text = f"{g:.4g} = {g / baseline:.3f} x the baseline's"
        else:
            asked, valid, g_text = f"{target:.4g} GMACs", f"it reaches {'>=' if low_end else '<='} {reach:.4g}", f"{g:.4g}"
        raise BudgetError(
            f"{method} cannot reach {asked}: its {'fewest' if low_end else 'most'} GMACs are {g_text} "
            f"({_fmt_value(knob.param, end)}); within the {100 * tolerance:g} % tolerance, {valid}")
    a, b = most, least  # count(a) >= target >= count(b) (up to the tolerance at the ends)
    if knob.integer:
        bisect = False
        while abs(a - b) > 1:
            width = abs(a - b)
            guess = (a + b) / 2 if bisect else _toward(a, b, c(a), c(b), target)
            m = min(max(int(round(guess)), min(a, b) + 1), max(a, b) - 1)
            if c(m) >= target:
                a = m
            else:
                b = m
            bisect = not bisect and abs(a - b) > width / 2
        best = min((a, b), key=lambda v: abs(c(v) - target))
        if within(c(best)) or not knob.per_block or a == b:
            return _landed(best, c(best), len(seen), target, tolerance, knob, method, (a, b), c)
        # the last k blocks at b, the others at a: k = 0 is a, k = depth is b (monotone in k)
        lists = lambda k: [a] * (depth - k) + [b] * k  # noqa: E731
        lo_k, hi_k = 0, depth
        while hi_k - lo_k > 1:
            k = (lo_k + hi_k) // 2
            if c(lists(k)) >= target:
                lo_k = k
            else:
                hi_k = k
        best_k = min((lo_k, hi_k), key=lambda k: abs(c(lists(k)) - target))
        value = lists(best_k)
        value = value[0] if len(set(value)) == 1 else value
        return _landed(value, c(value), len(seen), target, tolerance, knob, method, (a, b), c)
    bisect = False
    for _ in range(60):
        best = min(seen.values(), key=lambda vc: abs(vc[1] - target))
        width = abs(a - b)
        if abs(best[1] - target) <= _FLOAT_AIM * target or width < _FLOAT_STEP:
            break
        m = round((a + b) / 2 if bisect else _toward(a, b, c(a), c(b), target), _DIGITS)
        if not min(a, b) < m < max(a, b):
            m = round((a + b) / 2, _DIGITS)
            if m in (a, b):
                break
        if c(m) >= target:
            a = m
        else:
            b = m
        bisect = not bisect and abs(a - b) > width / 2
    value, g = min(seen.values(), key=lambda vc: abs(vc[1] - target))
    for digits in range(1, _DIGITS):  # a rounder value that lands as close reads better (ratio=0.7)
        rounder = round(value, digits)
        if min(low, high) <= rounder <= max(low, high) and rounder != value and \
                abs(c(rounder) - target) <= max(abs(g - target), _FLOAT_AIM * target):
            value, g = rounder, c(rounder)
            break
    return _landed(value, g, len(seen), target, tolerance, knob, method, (a, b), c)


def _toward(a: float, b: float, count_a: float, count_b: float, target: float) -> float:
    """Where the straight line through ``(a, count_a)`` and ``(b, count_b)`` meets ``target``."""
    if count_a == count_b:
        return (a + b) / 2
    return a + (count_a - target) / (count_a - count_b) * (b - a)


def _landed(value: Any, g: float, n: int, target: float, tolerance: float, knob: BudgetKnob, method: str,
            bracket: tuple[Any, Any], c: Callable[[Any], float]) -> tuple[Any, float, int]:
    if abs(g - target) <= tolerance * target:
        return value, g, n
    a, b = bracket
    if knob.coarse == "below":  # the nearest setting under the budget; the record says how far
        under = [(v, c(v)) for v in (a, b) if c(v) <= target]
        if under:
            v, g_under = max(under, key=lambda vc: vc[1])
            return v, g_under, n
    raise BudgetError(
        f"{method} cannot land within {100 * tolerance:g} % of {target:.4g} GMACs: its knob moves in "
        f"steps too coarse here ({_fmt_value(knob.param, a)} gives {c(a):.4g} GMACs, "
        f"{off_pct(c(a), target):+.1f} %; {_fmt_value(knob.param, b)} gives {c(b):.4g}, "
        f"{off_pct(c(b), target):+.1f} %)")


def not_matchable(method: str) -> BudgetError:
    """The error of a method without a budget knob at a matched budget."""
    return BudgetError(f"{method} is not matchable: its plugin declares no budget knob "
                       f"(MethodSpec.budget), so --match-gmacs/--budgets cannot set its compute")


def calibrate(spec: MethodSpec, values: Any, fraction: float, counter: GmacsCounter,
              info: ModelInfo) -> Calibration:
    """Choose ``spec``'s budget knob for ``fraction`` of the baseline's GMACs (counted by
    ``counter``, the same way the report counts them); the other parameters of ``values`` (the
    method's parameter dataclass, ``None``: its defaults) stay as they are.

    Raises :class:`BudgetError` for a method without a knob ("not matchable") and for a budget
    it cannot reach."""
    knob = spec.budget
    if knob is None:
        raise not_matchable(spec.name)
    fraction = check_fraction(fraction)
    values = spec.params() if values is None else values

    def at(value: Any) -> Any:  # the knob set, its limits checked as --param's are
        return checked(spec.name, dataclasses.replace(values, **{knob.param: value}))

    base = counter(None, None)
    target = fraction * base
    out = Calibration(method=spec.name, param=knob.param, value=None, mode=knob.mode, fraction=fraction,
                      baseline_gmacs=base, target_gmacs=target)
    if knob.mode == "fraction":
        out.value, out.values = fraction, at(fraction)
        return out
    low, high = knob.bounds(info)
    value, g, n = search_knob(lambda v: counter(spec.name, at(v)), knob, low, high, target,
                              method=spec.name, depth=info.depth, baseline=base)
    out.value, out.calibrated_gmacs, out.counts, out.values = value, g, n, at(value)
    return out
