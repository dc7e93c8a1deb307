"""Reports: pure functions of the result store's records (markdown tables and a PNG plot)."""
from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from vitbench.report._atomic import atomic_write_text
from vitbench.report.attached import attach
from vitbench.report.batches import batch_plot_path, has_curves, plot_speedup_vs_batch
from vitbench.report.markdown import render_markdown
from vitbench.report.plot import planned_panels, plot_accuracy_vs_gmacs
from vitbench.report.sweep import write_sweep_report
from vitbench.report.tables import comparison_table

__all__ = ["comparison_table", "plot_accuracy_vs_gmacs", "render_markdown", "write_report", "write_sweep_report"]


def write_report(records: Iterable[Mapping[str, Any]], out_md_path: str | os.PathLike[str], *,
                 command: str | None = None, title: str | None = None,
                 skipped: Sequence[str] = (), folder: str | os.PathLike[str] | None = None
                 ) -> tuple[Path, Optional[Path]]:
    """Write the markdown report and its plot beside it (same stem, ``.png``; none when nothing
    can be drawn, :func:`~vitbench.report.plot.planned_panels`), and where runs were timed at
    several batch sizes the speed-up against batch size (``<stem>-speedup-vs-batch.png``,
    :mod:`~vitbench.report.batches`); each file is written whole or
    not at all (a temp file, then a rename), and the markdown is rendered before either is
    written, so a record the report cannot render leaves both old files as they were.
    ``skipped``: the store's lines that are no record (``CorruptLine.describe()``), listed under
    the title. ``folder``: the run's folder, whose figures and published row are attached
    (:mod:`~vitbench.report.attached`; default the markdown's folder). Returns ``(md_path,
    png_path or None)``."""
    records = list(records)
    md_path = Path(out_md_path)
    png_path = md_path.with_suffix(".png") if planned_panels(records) else None
    batch_png = batch_plot_path(md_path) if has_curves(records) else None
    link, batch_link = (urllib.parse.quote(p.name, errors="surrogateescape") if p is not None else None
                        for p in (png_path, batch_png))
    text = render_markdown(records, title=title, command=command, plot_path=link, skipped=skipped,
                           batch_plot_path=batch_link)
    text = attach(text, Path(folder) if folder is not None else md_path.parent, records, md_path.parent)
    if png_path is not None:
        plot_accuracy_vs_gmacs(records, png_path)
    if batch_png is not None:
        plot_speedup_vs_batch(records, batch_png)
    atomic_write_text(md_path, text)
    return md_path, png_path
