"""Accuracy vs GMACs and accuracy vs throughput, one row of two panels per (task, model) and
what its runs were measured on (:func:`~vitbench.report.tables.panels`).

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
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vitbench.report._atomic import atomic_write_bytes
from vitbench.report.tables import CONTROL, accuracy_key, metric, ok_rows, panels, row_labels
from vitbench.report.task_shape import accuracy_columns

__all__ = ["plot_accuracy_vs_gmacs"]

_AXES = (
    ("gmacs", "gmacs_std", "GMACs (batch 1)"),
    ("throughput_img_s", "throughput_spread_img_s", "Throughput (img/s)"),
)


def _panel(ax: Axes, rows: list[Mapping[str, Any]], labels: list[str], base: Any,
           x_key: str, xerr_key: str, y_key: str) -> None:
    drawn = 0
    for i, (rec, label) in enumerate(zip(rows, labels)):
        x, y = metric(rec, x_key), metric(rec, y_key)
        if x is None or y is None:
            continue
        is_base, is_control = rec is base, rec.get("method") == CONTROL
        ax.errorbar(
            x, y, xerr=metric(rec, xerr_key) or None, yerr=metric(rec, f"{y_key}_seed_std") or None,
            fmt="*" if is_base or is_control else "o",
            markersize=12 if is_base or is_control else 7, capsize=3,
            # a row has one colour in both panels; the det/seg control is the baseline's hollow star
            color="black" if is_base or is_control else f"C{i % 10}",
            markerfacecolor="none" if is_control else None,
        )
        ax.annotate(label, (x, y), xytext=(5, 5), textcoords="offset points", fontsize=8)
        drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.2, y=0.15)  # room for the labels


def _speed_only(ax_g: Axes, ax_t: Axes, rows: list[Mapping[str, Any]], labels: list[str], base: Any,
                title: str, note: str = "") -> None:
    """A group without accuracy: throughput vs GMACs on the left (what was measured), and the
    right panel says why there is no accuracy panel (instead of two empty "no data" panels)."""
    _panel(ax_g, rows, labels, base, "gmacs", "gmacs_std", "throughput_img_s")
    ax_g.set_xlabel("GMACs (batch 1)")
    ax_g.set_ylabel("Throughput (img/s)")
    ax_g.set_title(f"{title}: throughput vs GMACs{note}")
    ax_t.set_axis_off()
    ax_t.text(0.5, 0.5, "accuracy not measured\n(--metrics without accuracy)", ha="center", va="center",
              transform=ax_t.transAxes)


def plot_accuracy_vs_gmacs(
    records: Iterable[Mapping[str, Any]], path_png: str | os.PathLike[str]
) -> Path:
    """Write the PNG to ``path_png`` (atomically) and return its path. Detection and
    segmentation plot box mAP; the baseline is the black star (the det/seg control a hollow
    one). Runs over several seeds are one
    point at their means, with the seeds' standard deviation as the vertical error bar."""
    records = list(records)
    pairs = panels(records) or [("cls", "(no runs)", None, "")]
    fig = Figure(figsize=(12, 4.5 * len(pairs)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(pairs), 2, squeeze=False)
    for (task, model, on, note), (ax_g, ax_t) in zip(pairs, axes):
        rows, base = ok_rows(records, task, model, on=on)  # on: runs measured on other images apart
        labels = row_labels(rows)
        y_key = accuracy_key(task)
        y_label = accuracy_columns(task)[0].axis
        if not any(metric(r, y_key) is not None for r in rows):  # e.g. --metrics gmacs,throughput
            _speed_only(ax_g, ax_t, rows, labels, base, f"{task} · {model}", note)
            continue
        for ax, (x_key, xerr_key, x_label) in zip((ax_g, ax_t), _AXES):
            _panel(ax, rows, labels, base, x_key, xerr_key, y_key)
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
        bs = {int(b) for r in rows if (b := metric(r, "batch_size")) is not None}
        if len(bs) == 1:
            ax_t.set_xlabel(f"Throughput (img/s, bs={bs.pop()})")
        ax_g.set_title(f"{task} · {model}: accuracy vs GMACs{note}")
        ax_t.set_title(f"{task} · {model}: accuracy vs throughput{note}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path_png, buf.getvalue())
