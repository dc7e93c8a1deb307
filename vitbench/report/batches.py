"""Where a speed-up begins (``--batch-sizes``): each method's speed-up over the baseline at every
batch size both were timed at, the batch size from which it is faster, and a plot of speed-up
against batch size (docs/measuring.md, "Where a speed-up begins").

Reducing tokens adds work per block (scoring, matching, gathering) that a small batch does not
amortise, so a method can be slower than the baseline at batch 1 and faster at batch 64
(Pruning One More Token is Enough, WACV 2025); one batch size cannot show where that turns.
"""
from __future__ import annotations

import io
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vitbench.report._atomic import atomic_write_bytes
from vitbench.report.doubts import MARK
from vitbench.report.tables import ok_rows, panels, row_labels
from vitbench.report.values import number
from vitbench.task import BASELINE, CONTROL

__all__ = ["batch_lines", "batch_plot_path", "break_even", "curve_speedups", "has_curves", "plot_speedup_vs_batch"]

Record = Mapping[str, Any]


def _positive(value: Any) -> Optional[float]:
    """``value`` as a finite float above 0, else ``None``."""
    v = number(value)
    return v if v is not None and v > 0 else None


def _points(rec: Record) -> dict[int, Record]:
    """The record's ``batch_curve`` by batch size (points without a valid batch size left out)."""
    out = {}
    for point in rec.get("batch_curve") or ():
        if isinstance(point, Mapping) and isinstance(point.get("batch_size"), int) and point["batch_size"] >= 1:
            out[int(point["batch_size"])] = point
    return out


def _per_seed(row: Record) -> list[Record]:
    return list(row.get("per_seed") or [row])


def curve_speedups(row: Record, base: Optional[Record]) -> dict[int, float]:
    """Per batch size, ``row``'s speed-up over the baseline: the median over its seeds of each
    seed's speed-up (the executor's, else its throughput over that of the baseline of the same
    seed), in increasing batch size; empty when ``row`` has no curve."""
    base_points = {r.get("seed"): _points(r) for r in _per_seed(base)} if base is not None else {}
    found: dict[int, list[float]] = {}
    for rec in _per_seed(row):
        theirs = base_points.get(rec.get("seed"), {})
        for batch, point in _points(rec).items():
            speedup = _positive(point.get("speedup"))
            if speedup is None:
                tp, b_tp = _positive(point.get("throughput_img_s")), _positive(theirs.get(batch, {}).get("throughput_img_s"))
                speedup = tp / b_tp if tp is not None and b_tp is not None else None
            if speedup is not None:
                found.setdefault(batch, []).append(speedup)
    return {batch: statistics.median(found[batch]) for batch in sorted(found)}


def break_even(speedups: Mapping[int, float]) -> Optional[int]:
    """The smallest batch size from which on ``speedups`` is above 1.0 at every larger batch size
    measured (faster than the baseline from there on); None when it is not faster at the largest."""
    batch = None
    for size in sorted(speedups, reverse=True):
        if speedups[size] <= 1.0:
            break
        batch = size
    return batch


def _said(speedups: Mapping[int, float]) -> str:
    """Where a method is faster than the baseline, in words."""
    sizes = sorted(speedups)
    span = f"{sizes[0]} to {sizes[-1]}" if len(sizes) > 1 else f"{sizes[0]}"
    start = break_even(speedups)
    slower = [s for s in sizes if speedups[s] <= 1.0]
    if start == sizes[0]:
        return f"faster than the baseline at every batch size measured ({span})"
    if start is not None:
        below = ", ".join(f"{speedups[s]:.2f}x at {s}" for s in slower)
        return f"faster than the baseline from batch {start} on ({below})"
    faster = [s for s in sizes if speedups[s] > 1.0]
    if not faster:
        best = max(sizes, key=lambda s: speedups[s])
        return (f"slower than the baseline at every batch size measured ({span}; at best "
                f"{speedups[best]:.2f}x, at batch {best})")
    return (f"faster only at batch {', '.join(map(str, faster))}, and slower at the largest measured "
            f"({speedups[sizes[-1]]:.2f}x at {sizes[-1]})")


def _doubted(row: Record, batch: int) -> bool:
    return any(_points(rec).get(batch, {}).get("flag_reason") for rec in _per_seed(row))


def _cell(row: Record, base: Optional[Record], batch: int, speedups: Mapping[int, float]) -> str:
    point = _points(row).get(batch)
    if point is None:
        return "n/a"
    ms = _positive(point.get("latency_ms"))
    timed = f"{ms:.1f} ms" if ms is not None else "n/a"
    doubted = _doubted(row, batch) or (base is not None and _doubted(base, batch))
    mark = f" {MARK}" if doubted else ""
    if row is base:
        tp = _positive(point.get("throughput_img_s"))
        return f"{tp:.0f} img/s, {timed}{mark}" if tp is not None else f"{timed}{mark}"
    speedup = speedups.get(batch)
    return f"{speedup:.2f}x, {timed}{mark}" if speedup is not None else f"{timed}{mark}"


def batch_lines(labels: Sequence[str], rows: Sequence[Record], base: Optional[Record]) -> list[str]:
    """The speed-up of each row at each batch size of its curve (the baseline's images per
    second; milliseconds per forward in every cell), and a sentence per method saying from which
    batch size it is faster than the baseline; nothing when no row has a curve."""
    curved = [(lab, r) for lab, r in zip(labels, rows) if _points(r)]
    if not curved:
        return []
    sizes = sorted({b for _, r in curved for b in _points(r)})
    speedups = {id(r): curve_speedups(r, base) for _, r in curved}
    head = "| Method | " + " | ".join(f"bs {b}" for b in sizes) + " |"
    lines = ["**Speed-up by batch size** (`--batch-sizes`; each cell: the speed-up over the baseline, or "
             "the baseline's images per second, and the milliseconds of one forward of the whole batch):",
             "", head, "| --- |" + " ---: |" * len(sizes)]
    lines += ["| " + lab.replace("|", "\\|") + " | " + " | ".join(_cell(r, base, b, speedups[id(r)]) for b in sizes)
              + " |" for lab, r in curved]
    lines.append("")
    reasons = [f"- {lab}, batch {b}: {why}" for lab, r in curved for b in sizes
               for why in dict.fromkeys(str(_points(rec).get(b, {}).get("flag_reason"))
                                        for rec in _per_seed(r) if _points(rec).get(b, {}).get("flag_reason"))]
    if reasons:
        lines += [f"{MARK} At this batch size the row's or the baseline's timing is not to be trusted (a baseline's "
                  f"mark goes to every row at its batch size):", "", *reasons, ""]
    methods = [(lab, speedups[id(r)]) for lab, r in curved if r.get("method") not in (BASELINE, CONTROL)]
    if base is None and methods:
        lines += ["No baseline was timed at these batch sizes: no speed-up to show.", ""]
    elif methods:
        lines += ["Where each method pays:"] + [f"- {lab}: {_said(s)}." if s else
                                                f"- {lab}: no batch size in common with the baseline."
                                                for lab, s in methods] + [""]
    return lines


def batch_plot_path(md_path: str | os.PathLike[str]) -> Path:
    """Where a report's speed-up against batch size is drawn: ``<stem>-speedup-vs-batch.png`` beside it."""
    md_path = Path(md_path)
    return md_path.with_name(f"{md_path.stem}-speedup-vs-batch.png")


def _planned(records: list[Record], part: str = "") -> list[tuple[str, list[tuple[str, dict[int, float]]]]]:
    """Per (task, model) and what it was measured on, the title (``part`` added to it) and the
    methods' speed-up curves; groups without one left out."""
    out = []
    for task, model, on, note in panels(records):
        rows, base = ok_rows(records, task, model, on=on)
        curves = [(lab, curve_speedups(r, base)) for lab, r in zip(row_labels(rows), rows)
                  if r.get("method") not in (BASELINE, CONTROL)]
        curves = [(lab, c) for lab, c in curves if c]
        if curves:
            out.append((f"{task} · {model}{part}: speed-up vs batch size{note}", curves))
    return out


def has_curves(records: Iterable[Record]) -> bool:
    """Whether any method has a speed-up curve (``--batch-sizes``, a baseline timed at the same sizes)."""
    return bool(_planned(list(records)))


def plot_speedup_vs_batch(records: Iterable[Record], path_png: str | os.PathLike[str], *,
                          parts: Sequence[tuple[str, Iterable[Record]]] = ()) -> Optional[Path]:
    """Speed-up over the baseline against batch size (log scale), a line per method and a panel
    per (task, model) and what it was measured on; with ``parts`` (a title suffix and its records,
    e.g. a sweep's budgets) a panel per part of each, instead of one of ``records``; written
    atomically. None, and no file, when no method has a speed-up curve."""
    drawn = ([panel for part, recs in parts for panel in _planned(list(recs), part)] if parts
             else _planned(list(records)))
    if not drawn:
        return None
    fig = Figure(figsize=(7, 4.5 * len(drawn)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (title, curves) in enumerate(drawn):
        ax = fig.add_subplot(len(drawn), 1, i + 1)
        for j, (label, speedups) in enumerate(curves):
            ax.plot(list(speedups), list(speedups.values()), marker="o", color=f"C{j % 10}", label=label)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="baseline")
        ax.set_xscale("log", base=2)
        sizes = sorted({b for _, c in curves for b in c})
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel("speed-up over the baseline (x)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path_png, buf.getvalue())
