"""The report's tables as one CSV or LaTeX table (``vitbench report DIR --format csv|latex``): every
(task, model) section's comparison table -- a sweep's, per budget -- with the section in leading
columns, cells as report.md shows them."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from vitbench.report._atomic import atomic_write_text
from vitbench.report.sweep import budget_records, budgets
from vitbench.report.tables import comparison_table, groups
from vitbench.results import latest_records

__all__ = ["is_sweep", "report_table", "write_table"]


def is_sweep(records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the records come from a sweep: a section holds runs at more than one budget, or a
    record's command was ``vitbench sweep`` / ``vitbench.sweep(...)``."""
    records = list(records)
    for r in records:
        command = (r.get("env") or {}).get("command")
        words = command if isinstance(command, (list, tuple)) else str(command or "").split()
        if any(str(w) == "sweep" or str(w).startswith("vitbench.sweep(") for w in words[:3]):
            return True
    return any(len(budgets(records, task, model)) > 1 for task, model in groups(records))


def report_table(records: Iterable[Mapping[str, Any]], sweep: bool = False) -> pd.DataFrame:
    """The comparison tables of every section, one below the other, led by ``Task``, ``Model``
    (and ``Budget`` for a sweep)."""
    records = latest_records(records)
    parts = []
    for task, model in groups(records):
        for budget in (budgets(records, task, model) if sweep else [None]):
            chosen = records if budget is None else budget_records(records, budget)
            table = comparison_table(chosen, task, model)
            lead = {"Task": task, "Model": model, **({"Budget": f"{budget:g}"} if sweep else {})}
            for i, (name, value) in enumerate(lead.items()):
                table.insert(i, name, value)
            parts.append(table)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def write_table(records: Iterable[Mapping[str, Any]], path: str | os.PathLike[str], fmt: str,
                sweep: bool = False) -> Path:
    """Write :func:`report_table` as ``csv`` or ``latex`` (booktabs, special characters escaped)."""
    table = report_table(records, sweep)
    if fmt == "csv":
        text = table.to_csv(index=False)
    else:
        text = table.to_markdown(index=False, tablefmt="latex_booktabs", disable_numparse=True) + "\n"
    return atomic_write_text(path, text)
