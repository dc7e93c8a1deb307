"""A sweep's curves: each method's aggregated rows by matched budget, and the area under them.

What the sweep report's summary (:mod:`vitbench.report.sweep`) and its Pareto plots
(:mod:`vitbench.report.pareto`) both read. Pure functions of the store's records.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from vitbench.report.tables import metric, ok_rows
from vitbench.report.task_shape import accuracy_columns, compute_key

__all__ = ["Curve", "accuracy_keys", "common_span", "curve_area", "curve_key", "curve_x_key", "curves", "gmacs_key",
           "record_budget"]

Record = Mapping[str, Any]


def accuracy_keys(task: str) -> tuple[str, ...]:
    """What a sweep compares as accuracy: the task's accuracy columns (top-1 for cls, box mAP for
    det, box and mask mAP for seg)."""
    return tuple(c.key for c in accuracy_columns(task))


def gmacs_key(task: str) -> str:
    """The GMACs a budget is matched on: the model's (cls), the backbone's (det/seg)."""
    return compute_key(task)


def record_budget(rec: Record) -> Optional[float]:
    """The budget F a run was matched to; ``None`` for an unmatched run."""
    return metric(rec, "match_gmacs")


@dataclass
class Curve:
    """One method across the budgets: its aggregated rows (over seeds) by budget."""

    name: str
    rows: dict[float, Record] = field(default_factory=dict)

    def points(self, x_key: str, y_key: str) -> list[tuple[float, float, float]]:
        """``(x, y, budget)`` of the rows that measured both, sorted by ``x``."""
        pts = [(x, y, b) for b, r in self.rows.items()
               if (x := metric(r, x_key)) is not None and (y := metric(r, y_key)) is not None]
        return sorted(pts)


def curve_key(rec: Record) -> tuple[str, str]:
    """A curve is a method with its other parameters (all but the matched knob)."""
    params = dict(rec.get("params") or {})
    knob = (rec.get("budget") or {}).get("param")
    params.pop(knob, None)
    return str(rec.get("method")), json.dumps(params, sort_keys=True, default=str)


def curves(records: Iterable[Record], task: str, model: str, on: Optional[str] = None) -> list[Curve]:
    """One :class:`Curve` per method (and setting of its other parameters), in store order; a
    method run with several settings of its other parameters gets, in each curve's name, the
    parameters in which they differ (``ltm (eta=0.0, ib_step=train)``). ``on``: only
    the runs measured on that :func:`~vitbench.report.tables.measured_groups` key."""
    rows, _ = ok_rows(list(records), task, model, on=on)
    by_key: dict[tuple[str, str], Curve] = {}
    for r in rows:
        b = record_budget(r)
        if b is None or r.get("method") == "baseline":
            continue
        key = curve_key(r)
        by_key.setdefault(key, Curve(name=key[0])).rows.setdefault(b, r)
    for method in dict.fromkeys(m for m, _ in by_key):
        keys = [k for k in by_key if k[0] == method]
        if len(keys) < 2:
            continue
        settings = [json.loads(k[1]) for k in keys]
        differ = sorted({p for s in settings for p in s if any(s.get(p) != t.get(p) for t in settings)})
        for key, setting in zip(keys, settings):
            by_key[key].name = f"{method} ({', '.join(f'{p}={setting.get(p)}' for p in differ)})"
    return list(by_key.values())


def curve_area(curve: Curve, y_key: str, base_x: float, span: tuple[float, float]) -> Optional[float]:
    """The area under ``curve``'s ``y_key`` against its measured GMACs fraction (``x / base_x``,
    linear between budgets) over ``span``, divided by the span's width: the curve's mean ``y``
    over that range. ``None`` when the curve does not cover the span or the span is a point."""
    lo, hi = span
    pts = [(x / base_x, y) for x, y, _ in curve.points(curve_x_key(curve), y_key)]
    if len(pts) < 2 or not hi > lo:
        return None
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    if xs[0] > lo + 1e-9 or xs[-1] < hi - 1e-9:
        return None
    grid = np.concatenate([[lo], xs[(xs > lo) & (xs < hi)], [hi]])
    vals = np.interp(grid, xs, ys)
    return float(np.sum((vals[1:] + vals[:-1]) / 2 * np.diff(grid)) / (hi - lo))


def curve_x_key(curve: Curve) -> str:
    """The GMACs field of ``curve``'s rows (the backbone's on det/seg)."""
    first = next(iter(curve.rows.values()), {})
    return gmacs_key(str(first.get("task", "cls")))


def common_span(cs: list[Curve], y_key: str, base_x: float) -> Optional[tuple[float, float]]:
    """The GMACs-fraction range every curve with at least two points covers."""
    spans = []
    for c in cs:
        xs = [x / base_x for x, _, _ in c.points(curve_x_key(c), y_key)]
        if len(xs) >= 2:
            spans.append((min(xs), max(xs)))
    if not spans:
        return None
    lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
    return (lo, hi) if hi > lo else None
