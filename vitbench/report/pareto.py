"""Pareto plots of a sweep: accuracy against GMACs, and against throughput, one line per method
across its budgets in order of the x axis (each point with its interval; a throughput not to be
trusted hollow, the method's legend entry marked), the baseline as a black star (one row of panels per (task, model) and what
its runs were measured on, :func:`~vitbench.report.tables.panels`; seg:
box and mask mAP side by side). matplotlib's object API on the Agg canvas, as
:mod:`vitbench.report.plot`.

When no run measured accuracy, the y axis is the budget F instead (so a GMACs-and-throughput
sweep still shows where each method landed and how fast it ran there), and the title says so.
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
from vitbench.report.curves import Curve, accuracy_keys, curves, gmacs_key
from vitbench.report.doubts import MARK, row_doubts
from vitbench.report.plot import accuracy_error
from vitbench.report.tables import metric, ok_rows, panels
from vitbench.report.task_shape import accuracy_column
from vitbench.results.store import latest_records

__all__ = ["plot_pareto"]

_X = {"gmacs": "GMACs (batch 1)", "throughput": "Throughput (img/s)"}


def _x_key(x: str, task: str) -> str:
    return gmacs_key(task) if x == "gmacs" else "throughput_img_s"


def _panel(ax: Axes, cs: list[Curve], base: Any, x_key: str, y_key: str) -> int:
    drawn = 0
    for i, c in enumerate(cs):
        if y_key == "match_gmacs":  # no accuracy: the budget itself
            pts = sorted((x, b, b) for b, r in c.rows.items() if (x := metric(r, x_key)) is not None)
        else:
            pts = c.points(x_key, y_key)
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        color = f"C{i % 10}"
        doubted = [x_key == "throughput_img_s" and bool(row_doubts(c.rows[b], base).throughput) for _, _, b in pts]
        ax.plot(xs, ys, color=color, label=c.name + (f" ({MARK}: timing not to be trusted)" if any(doubted) else ""))
        for (x, y, b), hollow in zip(pts, doubted):  # each budget's point, its interval, hollow when doubted
            yerr = None if y_key == "match_gmacs" else accuracy_error(c.rows[b], y_key, y)
            ax.errorbar(x, y, yerr=yerr, fmt="o", color=color, capsize=2, markerfacecolor="none" if hollow else None)
            ax.annotate(f"{b:g}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
        drawn += 1
    bx = metric(base, x_key)
    by = 1.0 if y_key == "match_gmacs" else metric(base, y_key)
    if bx is not None and by is not None:
        ax.plot([bx], [by], marker="*", markersize=14, color="black", linestyle="none", label="baseline")
        drawn += 1
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, alpha=0.3)
    return drawn


def plot_pareto(records: Iterable[Mapping[str, Any]], path_png: str | os.PathLike[str], *, x: str) -> Path:
    """Write the Pareto plot of accuracy against ``x`` (``"gmacs"`` or ``"throughput"``) to
    ``path_png`` atomically; each point is annotated with its budget F."""
    if x not in _X:
        raise ValueError(f"x={x!r}; valid: {', '.join(_X)}")
    records = latest_records(records)
    pairs = panels(records) or [("cls", "(no runs)", None, "")]
    ncols = max(len(accuracy_keys(task)) for task, *_ in pairs)
    fig = Figure(figsize=(7 * ncols, 5 * len(pairs)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(pairs), ncols, squeeze=False)
    for (task, model, on, note), row in zip(pairs, axes):
        _, base = ok_rows(records, task, model, on=on)  # on: runs measured on other images apart
        cs = curves(records, task, model, on=on)
        x_key = _x_key(x, task)
        for ax, y_key in zip(row, accuracy_keys(task)):
            measured = any(metric(r, y_key) is not None for c in cs for r in c.rows.values())
            plotted = y_key if measured else "match_gmacs"
            _panel(ax, cs, base, x_key, plotted)
            label = _X[x] if x_key != "backbone_gmacs" else "backbone GMACs (batch 1)"
            bs = {int(b) for c in cs for r in c.rows.values() if (b := metric(r, "batch_size")) is not None}
            if x == "throughput" and len(bs) == 1:
                label = f"Throughput (img/s, bs={bs.pop()})"
            ax.set_xlabel(label)
            axis = accuracy_column(task, y_key).axis
            ax.set_ylabel(axis if measured else "budget F (fraction of the baseline's GMACs)")
            what = axis if measured else "budget (no accuracy measured)"
            ax.set_title(f"{task} · {model}: {what} vs {'GMACs' if x == 'gmacs' else 'throughput'}{note}")
        for ax in row[len(accuracy_keys(task)):]:
            ax.set_visible(False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path_png, buf.getvalue())
