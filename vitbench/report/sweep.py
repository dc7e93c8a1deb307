"""The report of a sweep (``vitbench sweep``): every method at several matched budgets.

Per (task, model): a summary table (accuracy at each budget, and the area under each method's
accuracy-vs-GMACs curve over the budget range every method covers), the Pareto plots
(:mod:`vitbench.report.pareto`), then one comparison table per budget, built by the same
:func:`~vitbench.report.markdown.group_section` as ``vitbench run``'s report from the baseline
and the runs at that budget. A pure function of the store's records.
"""
from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from vitbench.report._atomic import atomic_write_bytes
from vitbench.report.markdown import group_section, header_lines
from vitbench.report.tables import NA, drop_unmeasured, gmacs_spec, groups, metric, ok_rows
from vitbench.report.task_shape import accuracy_column, accuracy_columns, compute_key, compute_name
from vitbench.results.store import latest_records

__all__ = ["Curve", "accuracy_keys", "budget_records", "budgets", "curve_area", "curves", "summary_table",
           "render_sweep_markdown", "write_sweep_report"]

Record = Mapping[str, Any]
#: the Pareto plots beside report.md
PARETO_FILES = ("pareto_gmacs.png", "pareto_throughput.png")


def accuracy_keys(task: str) -> tuple[str, ...]:
    """What a sweep compares as accuracy: the task's accuracy columns (top-1 for cls, box mAP for
    det, box and mask mAP for seg)."""
    return tuple(c.key for c in accuracy_columns(task))


def gmacs_key(task: str) -> str:
    """The GMACs a budget is matched on: the model's (cls), the backbone's (det/seg)."""
    return compute_key(task)


def _budget(rec: Record) -> Optional[float]:
    return metric(rec, "match_gmacs")


def budgets(records: Iterable[Record], task: str, model: str) -> list[float]:
    """The matched budgets of ``(task, model)``, largest first."""
    found = {b for r in latest_records(records) if (str(r.get("task")), str(r.get("model"))) == (task, model)
             and (b := _budget(r)) is not None}
    return sorted(found, reverse=True)


def budget_records(records: Iterable[Record], budget: float) -> list[Record]:
    """The unmatched baseline runs and the runs at ``budget``: one budget's comparison."""
    return [r for r in records if (r.get("method") == "baseline" and _budget(r) is None) or _budget(r) == budget]


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


def _curve_key(rec: Record) -> tuple[str, str]:
    """A curve is a method with its other parameters (all but the matched knob)."""
    params = dict(rec.get("params") or {})
    knob = (rec.get("budget") or {}).get("param")
    params.pop(knob, None)
    return str(rec.get("method")), json.dumps(params, sort_keys=True, default=str)


def curves(records: Iterable[Record], task: str, model: str) -> list[Curve]:
    """One :class:`Curve` per method (and setting of its other parameters), in store order; a
    method run with two settings of its other parameters gets them in its name."""
    rows, _ = ok_rows(list(records), task, model)
    by_key: dict[tuple[str, str], Curve] = {}
    for r in rows:
        b = _budget(r)
        if b is None or r.get("method") == "baseline":
            continue
        key = _curve_key(r)
        by_key.setdefault(key, Curve(name=key[0])).rows.setdefault(b, r)
    names = [c.name for c in by_key.values()]
    for (method, params), c in by_key.items():
        if names.count(method) > 1:
            c.name = f"{method} {params}"
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


def _fmt(v: Optional[float], spec: str) -> str:
    return NA if v is None else format(v, spec)


def has_accuracy(records: Iterable[Record], task: str, model: str, y_key: str) -> bool:
    """Whether any matched run of ``(task, model)`` measured ``y_key``."""
    return any(metric(r, y_key) is not None for c in curves(list(records), task, model) for r in c.rows.values())


def summary_table(records: Iterable[Record], task: str, model: str, y_key: Optional[str] = None) -> pd.DataFrame:
    """One row per method: its accuracy (``y_key``, default the task's first accuracy key) at
    each budget and the area under its curve over the common range (:func:`curve_area`). When
    no run measured accuracy, the cells hold the GMACs each run landed at instead. A budget a
    method failed at says so."""
    records = latest_records(records)
    y_key = y_key or accuracy_keys(task)[0]
    x_key = gmacs_key(task)
    _, base = ok_rows(records, task, model)
    base_x = metric(base, x_key)
    cs = curves(records, task, model)
    has_acc = has_accuracy(records, task, model, y_key)
    spec = accuracy_column(task, y_key).fmt
    failed = {(_curve_key(r)[0], _budget(r)) for r in records
              if r.get("status") == "error" and (str(r.get("task")), str(r.get("model"))) == (task, model)}
    span = common_span(cs, y_key, base_x) if has_acc and base_x else None
    area_col = f"Area ÷ range, F {span[0]:.2f}–{span[1]:.2f}" if span else "Area ÷ range"
    table = []
    methods = [c.name for c in cs] + sorted({m for m, _ in failed} - {c.name.split(" ")[0] for c in cs})
    by_name = {c.name: c for c in cs}
    for m in methods:
        c = by_name.get(m, Curve(name=m))
        row: dict[str, str] = {"Method": m}
        for b in budgets(records, task, model):
            r = c.rows.get(b)
            col = f"F = {b:g}"
            if r is None:
                row[col] = "failed" if (m.split(" ")[0], b) in failed else NA
            elif has_acc:
                sd = metric(r, f"{y_key}_seed_std")
                v = metric(r, y_key)
                row[col] = _fmt(v, spec) + (f" ± {sd:{spec}}" if v is not None and sd else "")
            else:
                g = metric(r, x_key)
                row[col] = NA if g is None else f"{g:{gmacs_spec(g)}} GMACs" + (
                    f" ({100 * (g / base_x - 1):+.1f} % vs baseline)" if base_x else "")
        if has_acc:
            row[area_col] = _fmt(curve_area(c, y_key, base_x, span), spec) if span and base_x else NA
        table.append(row)
    df = pd.DataFrame(table, columns=["Method"] + [f"F = {b:g}" for b in budgets(records, task, model)]
                      + ([area_col] if has_acc else []))
    # the area column stays when accuracy was measured: n/a there means no common range
    return drop_unmeasured(df, keep=("Method", area_col)) if not df.empty else df


def _summary_lines(records: list[Record], task: str, model: str) -> list[str]:
    _, base = ok_rows(records, task, model)
    x_key = gmacs_key(task)
    lines = ["### Summary", ""]
    base_x = metric(base, x_key)
    what = compute_name(task)
    if base is not None:
        accs = [f"{c.title} {_fmt(metric(base, c.key), c.fmt)}" for c in accuracy_columns(task)
                if metric(base, c.key) is not None]
        lines += [f"Baseline: {', '.join(accs + [f'{_fmt(base_x, gmacs_spec(base_x))} {what}'])}. "
                  f"F: the fraction of the baseline's {what} each method was matched to.", ""]
    any_acc = False
    for y_key in accuracy_keys(task):
        df = summary_table(records, task, model, y_key)
        has_acc = has_accuracy(records, task, model, y_key)
        any_acc = any_acc or has_acc
        if has_acc or y_key == accuracy_keys(task)[0]:
            title = (f"{accuracy_column(task, y_key).title} at each budget:" if has_acc
                     else f"{what[0].upper() + what[1:]} at each budget (no accuracy measured):")
            lines += [title, "",
                      df.to_markdown(index=False, disable_numparse=True,
                                     colalign=("left",) + ("right",) * (len(df.columns) - 1)), ""]
    if any_acc:
        lines += [f"Area ÷ range: the area under the method's accuracy curve against its measured {what} "
                  f"fraction (its {what} / the baseline's; linear between budgets) over the range every method "
                  f"covers, divided by that range's width, i.e. the method's mean accuracy over the range; "
                  f"higher is better; n/a when fewer than two budgets of every method succeeded. \"failed\": the run at that budget is an error (listed under its "
                  f"budget's table).", ""]
    return lines


def render_sweep_markdown(records: Iterable[Record], *, command: Optional[str] = None,
                          title: Optional[str] = None, plot_paths: tuple[str, ...] = ()) -> str:
    """The sweep report as markdown; ``plot_paths`` (relative links) are the Pareto plots."""
    records = latest_records(records)
    lines = header_lines(records, title=title or "vitbench sweep", command=command)
    for task, model in groups(records):
        bs = budgets(records, task, model)
        lines += [f"## {task} · {model}", "",
                  f"Budgets: {', '.join(f'{b:g}' for b in bs) or 'none'} (fractions of the baseline's GMACs; "
                  f"each method's budget knob matched to each, within 2 %).", ""]
        lines += _summary_lines(records, task, model)
        for path, what in zip(plot_paths, ("GMACs", "throughput")):
            lines += [f"![Pareto: accuracy vs {what}]({path})", ""]
        for b in bs:
            lines += group_section(budget_records(records, b), task, model,
                                   heading=f"### F = {b:g} ({100 * b:g} % of the baseline's GMACs)")
    return "\n".join(lines)


def write_sweep_report(records: Iterable[Record], out_md_path: str | os.PathLike[str], *,
                       command: Optional[str] = None, title: Optional[str] = None) -> tuple[Path, list[Path]]:
    """Write the sweep's markdown and its two Pareto PNGs (:data:`PARETO_FILES`) beside it, each
    atomically; returns ``(md_path, [png paths])``."""
    from vitbench.report.pareto import plot_pareto

    records = list(records)
    md_path = Path(out_md_path)
    pngs = [md_path.with_name(name) for name in PARETO_FILES]
    text = render_sweep_markdown(records, command=command, title=title,
                                 plot_paths=tuple(urllib.parse.quote(p.name) for p in pngs))
    plot_pareto(records, pngs[0], x="gmacs")
    plot_pareto(records, pngs[1], x="throughput")
    atomic_write_bytes(md_path, text.encode("utf-8"))
    return md_path, pngs
