"""Accuracy vs GMACs and accuracy vs throughput, one row of panels per (task, model) and what its
runs were measured on (:func:`~vitbench.report.tables.panels`); only panels with a point are drawn
(throughput vs GMACs where no row measured accuracy), and no file at all when none has one.

Fewer GMACs do not always mean more images per second (docs/measuring.md), so the two panels
sit side by side: a method that moves left on the first but not right on the second saves
MACs the hardware does not turn into time. Uses matplotlib's object API with the Agg canvas,
never pyplot, so no display and no global backend switch.
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vitbench.report._atomic import atomic_write_bytes
from vitbench.report.data_words import data_words
from vitbench.report.doubts import MARK, row_doubts
from vitbench.report.row_facts import interval_pct
from vitbench.report.tables import CONTROL, accuracy_key, metric, ok_rows, panels, row_labels
from vitbench.report.task_shape import accuracy_columns

__all__ = ["accuracy_error", "plot_accuracy_vs_gmacs", "planned_panels"]

_AXES = (
    ("gmacs", "gmacs_std", "GMACs (batch 1)"),
    ("throughput_img_s", "throughput_spread_img_s", "Throughput (img/s)"),
)


def _panel(ax: Axes, rows: list[Mapping[str, Any]], labels: list[str], base: Any,
           x_key: str, xerr_key: str, y_key: str) -> None:
    for i, (rec, label) in enumerate(zip(rows, labels)):
        x, y = metric(rec, x_key), metric(rec, y_key)
        if x is None or y is None:
            continue
        is_base, is_control = rec is base, rec.get("method") == CONTROL
        doubted = "throughput_img_s" in (x_key, y_key) and bool(row_doubts(rec, base).throughput)
        ax.errorbar(
            x, y, xerr=metric(rec, xerr_key) or None, yerr=accuracy_error(rec, y_key, y),
            fmt="*" if is_base or is_control else "o",
            markersize=12 if is_base or is_control else 7, capsize=3,
            # a row has one colour in both panels; the det/seg control is the baseline's hollow star,
            # a timing not to be trusted a hollow point
            color="black" if is_base or is_control else f"C{i % 10}",
            markerfacecolor="none" if is_control or doubted else None,
            label=f"{label} {MARK} (timing not to be trusted)" if doubted else label,
        )
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.1, y=0.1)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)  # labels never overlap


def accuracy_error(rec: Mapping[str, Any], y_key: str, y: float) -> Any:
    """The vertical error bar: the seeds' standard deviation, else for a share of images (top-1
    in %) of one run its 95 % Wilson interval, as the table gives it; ``None`` otherwise."""
    std = metric(rec, f"{y_key}_seed_std")
    if std:
        return std
    interval = interval_pct(y, metric(rec, "num_images")) if y_key.endswith("_pct") else None
    if interval is None:
        return None
    lo, hi = interval
    return [[max(0.0, y - lo)], [max(0.0, hi - y)]]


#: one planned panel: ``(task, model, on, note, x key, x error key, y key)``
_Planned = tuple[str, str, Optional[str], str, str, str, str]


def _has(rows: list[Mapping[str, Any]], x_key: str, y_key: str) -> bool:
    return any(metric(r, x_key) is not None and metric(r, y_key) is not None for r in rows)


def planned_panels(records: Iterable[Mapping[str, Any]]) -> list[list[_Planned]]:
    """Per (task, model) and what it was measured on, the panels that have a point to draw:
    accuracy vs GMACs and vs throughput, or throughput vs GMACs where no row measured accuracy;
    groups with none are left out."""
    records = list(records)
    out = []
    for task, model, on, note in panels(records):
        rows, _ = ok_rows(records, task, model, on=on)
        y_key = accuracy_key(task)
        wanted = ([(x, e, y_key) for x, e, _ in _AXES] if any(metric(r, y_key) is not None for r in rows)
                  else [("gmacs", "gmacs_std", "throughput_img_s")])
        row = [(task, model, on, note, x, e, y) for x, e, y in wanted if _has(rows, x, y)]
        if row:
            out.append(row)
    return out


def _draw(ax: Axes, records: list[Mapping[str, Any]], planned: _Planned) -> None:
    task, model, on, note, x_key, xerr_key, y_key = planned
    rows, base = ok_rows(records, task, model, on=on)  # on: runs measured on other images apart
    _panel(ax, rows, row_labels(rows), base, x_key, xerr_key, y_key)
    x_label = dict((k, lab) for k, _, lab in _AXES)[x_key]
    bs = {int(b) for r in rows if (b := metric(r, "batch_size")) is not None}
    if x_key == "throughput_img_s" and len(bs) == 1:
        x_label = f"Throughput (img/s, bs={bs.pop()})"
    y_label = "Throughput (img/s)" if y_key == "throughput_img_s" else accuracy_columns(task)[0].axis
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    what = "accuracy" if y_key != "throughput_img_s" else "throughput"
    data = data_words(rows)
    ax.set_title(f"{task} · {model}: {what} vs {'GMACs' if x_key == 'gmacs' else 'throughput'}{note}"
                 + (f"\n{data}" if data else ""), fontsize=10)


def plot_accuracy_vs_gmacs(
    records: Iterable[Mapping[str, Any]], path_png: str | os.PathLike[str]
) -> Optional[Path]:
    """Write the PNG to ``path_png`` (atomically) and return its path; ``None``, and no file, when
    no panel has a point to draw (:func:`planned_panels`: only panels with data are drawn).
    Detection and segmentation plot box mAP; the baseline is the black star (the det/seg control
    a hollow one). Runs over several seeds are one point at their means, with the seeds'
    standard deviation as the vertical error bar; one run's top-1 has its 95 % Wilson interval.
    A throughput not to be trusted (:mod:`vitbench.report.doubts`) is a hollow point named in
    the legend, which holds the labels beside each panel."""
    records = list(records)
    plan = planned_panels(records)
    if not plan:
        return None
    cols = max(len(row) for row in plan)
    fig = Figure(figsize=(6 * cols, 4.5 * len(plan)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, row in enumerate(plan):
        for j, planned in enumerate(row):
            _draw(fig.add_subplot(len(plan), cols, i * cols + j + 1), records, planned)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path_png, buf.getvalue())
