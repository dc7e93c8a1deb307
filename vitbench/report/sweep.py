"""The report of a sweep (``vitbench sweep``): every method at several matched budgets.

Per (task, model): a summary table (accuracy at each budget, and the area under each method's
accuracy-vs-GMACs curve over the budget range every method covers), the Pareto plots
(:mod:`vitbench.report.pareto`), then one comparison table per budget, built by the same
:func:`~vitbench.report.markdown.group_section` as ``vitbench run``'s report from the baseline
and the runs at that budget; runs measured on other images, heads or weights get a summary and
tables of their own. A pure function of the store's records.
"""
from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from vitbench.report._atomic import atomic_write_text
from vitbench.report.batches import batch_plot_path, has_curves, plot_speedup_vs_batch
from vitbench.report.curves import (
    Curve, accuracy_keys, common_span, curve_area, curve_key, curves, gmacs_key, record_budget,
)
from vitbench.report.markdown import group_section, header_lines
from vitbench.report.measured_on import describe, in_group
from vitbench.report.tables import (
    NA, drop_unmeasured, gmacs_spec, groups, measured_groups, metric, ok_rows, trained_cell,
)
from vitbench.report.words import distinct
from vitbench.report.task_shape import accuracy_column, accuracy_columns, compute_name
from vitbench.results.store import latest_records
from vitbench.report.pareto import plot_pareto

__all__ = ["budget_parts", "budget_records", "budgets", "summary_table", "render_sweep_markdown", "write_sweep_report"]

Record = Mapping[str, Any]
#: the Pareto plots beside report.md
PARETO_FILES = ("pareto_gmacs.png", "pareto_throughput.png")


def budgets(records: Iterable[Record], task: str, model: str) -> list[float]:
    """The matched budgets of ``(task, model)``, largest first."""
    found = {b for r in latest_records(records) if (str(r.get("task")), str(r.get("model"))) == (task, model)
             and (b := record_budget(r)) is not None}
    return sorted(found, reverse=True)


def budget_records(records: Iterable[Record], budget: float) -> list[Record]:
    """The unmatched baseline runs and the runs at ``budget``: one budget's comparison."""
    return [r for r in records if (r.get("method") == "baseline" and record_budget(r) is None)
            or record_budget(r) == budget]


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
    failed = {(curve_key(r)[0], record_budget(r)) for r in records
              if r.get("status") == "error" and (str(r.get("task")), str(r.get("model"))) == (task, model)}
    span = common_span(cs, y_key, base_x) if has_acc and base_x else None
    area_col = f"Area ÷ range, F {span[0]:.2f}–{span[1]:.2f}" if span else "Area ÷ range"
    table = []
    methods = [c.name for c in cs] + sorted({m for m, _ in failed} - {c.name.split(" ")[0] for c in cs})
    by_name = {c.name: c for c in cs}
    for m in methods:
        c = by_name.get(m, Curve(name=m))
        row: dict[str, str] = {"Method": m, "Trained": "; ".join(distinct(trained_cell(r) for r in c.rows.values()))}
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
    trained = ["Trained"] if any(r.get("trained") for c in cs for r in c.rows.values()) else []
    df = pd.DataFrame(table, columns=["Method", *trained] + [f"F = {b:g}" for b in budgets(records, task, model)]
                      + ([area_col] if has_acc else []))
    # the area column stays when accuracy was measured: n/a there means no common range
    return drop_unmeasured(df, keep=("Method", area_col)) if not df.empty else df


def _summary_lines(records: list[Record], task: str, model: str, level: str = "###") -> list[str]:
    _, base = ok_rows(records, task, model)
    x_key = gmacs_key(task)
    lines = [f"{level} Summary", ""]
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


def budget_parts(records: Iterable[Record]) -> list[tuple[str, list[Record]]]:
    """Each budget of any (task, model), largest first, as a title suffix and its comparison's records."""
    records = latest_records(records)
    found = sorted({b for task, model in groups(records) for b in budgets(records, task, model)}, reverse=True)
    return [(f" at F = {b:g}", budget_records(records, b)) for b in found]


def render_sweep_markdown(records: Iterable[Record], *, command: Optional[str] = None,
                          title: Optional[str] = None, plot_paths: tuple[str, ...] = (),
                          skipped: Sequence[str] = (), batch_plot_path: Optional[str] = None) -> str:
    """The sweep report as markdown; ``plot_paths`` (relative links) are the Pareto plots,
    ``batch_plot_path`` the speed-up against batch size (``--batch-sizes``)."""
    records = latest_records(records)
    lines = header_lines(records, title=title or "vitbench sweep", command=command, skipped=skipped)
    for task, model in groups(records):
        bs = budgets(records, task, model)
        lines += [f"## {task} · {model}", "",
                  f"Budgets: {', '.join(f'{b:g}' for b in bs) or 'none'} (fractions of the baseline's GMACs; "
                  f"each method's budget knob matched to each, within 2 %).", ""]
        plots = [line for path, what in zip(plot_paths, ("GMACs", "throughput"))
                 for line in (f"![Pareto: accuracy vs {what}]({path})", "")]
        if batch_plot_path:
            plots += [f"![Speed-up over the baseline against batch size, a panel per budget]({batch_plot_path})", ""]
        keys = measured_groups(records, task, model)
        if len(keys) > 1:
            lines += [f"These runs were measured on {len(keys)} different sets of evaluation images, classifier "
                      f"heads or weights, each with its own summary and tables: a run is compared only with "
                      f"the baseline measured on the same ones.", ""] + plots
        for key in keys if len(keys) > 1 else [None]:
            level, ours = "###", records
            if key is not None:
                lines += [f"### Measured on {describe(key)}", ""]
                level = "####"
                ours = [r for r in records if (str(r.get("task")), str(r.get("model"))) != (task, model)
                        or in_group(r, key)]
            lines += _summary_lines(ours, task, model, level)
            if key is None:
                lines += plots
            for b in budgets(ours, task, model):
                lines += group_section(budget_records(ours, b), task, model,
                                       heading=f"{level} F = {b:g} ({100 * b:g} % of the baseline's GMACs)")
            unmatched = [r for r in ours if record_budget(r) is None]
            if any(r.get("method") != "baseline" for r in unmatched):
                lines += group_section(unmatched, task, model,
                                       heading=f"{level} At their own settings (matched to no budget)")
    return "\n".join(lines)


def write_sweep_report(records: Iterable[Record], out_md_path: str | os.PathLike[str], *,
                       command: Optional[str] = None, title: Optional[str] = None,
                       skipped: Sequence[str] = ()) -> tuple[Path, list[Path]]:
    """Write the sweep's markdown and its two Pareto PNGs (:data:`PARETO_FILES`) beside it, and
    where runs were timed at several batch sizes the speed-up against batch size, a panel per
    budget (:func:`~vitbench.report.batches.batch_plot_path`), each atomically; returns
    ``(md_path, [png paths])``."""
    records = list(records)
    md_path = Path(out_md_path)
    pngs = [md_path.with_name(name) for name in PARETO_FILES]
    parts = budget_parts(records)
    batch_png = batch_plot_path(md_path) if any(has_curves(recs) for _, recs in parts) else None
    link = urllib.parse.quote
    text = render_sweep_markdown(records, command=command, title=title,
                                 plot_paths=tuple(link(p.name, errors="surrogateescape") for p in pngs), skipped=skipped,
                                 batch_plot_path=link(batch_png.name, errors="surrogateescape") if batch_png else None)
    plot_pareto(records, pngs[0], x="gmacs")
    plot_pareto(records, pngs[1], x="throughput")
    if batch_png is not None:
        plot_speedup_vs_batch(records, batch_png, parts=parts)
    atomic_write_text(md_path, text)
    return md_path, pngs + ([batch_png] if batch_png is not None else [])
