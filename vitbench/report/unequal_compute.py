"""A warning under a table whose method rows ran at unequal compute: accuracy at -80 % GMACs beside
accuracy at -50 % compares two budgets, not two methods (docs/measuring.md, "Matched compute").
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vitbench.report.tables import gmacs_spec, metric
from vitbench.report.task_shape import compute_key, compute_name
from vitbench.task import BASELINE, CONTROL

__all__ = ["TOLERANCE_PCT", "unequal_compute_lines"]

#: method rows whose GMACs differ by more than this (largest over smallest) are warned about
TOLERANCE_PCT = 5.0


def unequal_compute_lines(task: str, labels: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One warning sentence (and a blank line) when the method rows (baseline and control aside)
    were not all matched with ``--match-gmacs`` and their GMACs (the task's budget count) differ
    by more than :data:`TOLERANCE_PCT`; else nothing."""
    key = compute_key(task)
    methods = [(lab, r) for lab, r in zip(labels, rows) if r.get("method") not in (BASELINE, CONTROL)]
    if not methods or all(r.get("match_gmacs") is not None for _, r in methods):
        return []
    counted = [(lab, g) for lab, r in methods if (g := metric(r, key)) is not None and g > 0]
    if len(counted) < 2:
        return []
    low, high = min(g for _, g in counted), max(g for _, g in counted)
    if (high / low - 1) * 100 <= TOLERANCE_PCT:
        return []
    listed = ", ".join(f"{lab} at {format(g, gmacs_spec(g))}" for lab, g in counted)
    return [f"> **Warning:** these methods ran at different compute ({compute_name(task)}: {listed}; "
            f"{(high / low - 1) * 100:.0f} % apart), so their accuracies compare budgets as much as "
            f"methods: use `--match-gmacs F` (e.g. `--match-gmacs 0.5`) to compare them at equal compute.",
            ""]
