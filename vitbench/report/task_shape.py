"""What the reports show of a task: its accuracy columns and whose GMACs its budgets are matched
on, as the task's :class:`~vitbench.task.Task` declares them (``accuracy``, ``counts``).

A store may hold runs of a task whose plugin is not installed here: such a task is reported with
the model's GMACs and without accuracy columns (its records are still shown, cell by cell).
"""
from __future__ import annotations

from typing import Optional

from vitbench.catalog import ReportColumn
from vitbench import task as task_contract
from vitbench.task import Task
from vitbench.host import get_host

__all__ = ["accuracy_column", "accuracy_columns", "compute_key", "compute_name", "task_spec"]

#: the accuracy column of an unregistered task: no record holds it, so the column is left out
_UNKNOWN = (ReportColumn("accuracy", "Accuracy", "ΔAccuracy"),)


def task_spec(task: str) -> Optional[Task]:
    """The registered task ``task``, or ``None`` when no loaded plugin registers it."""
    return get_host().catalogs["tasks"].get(task)


def accuracy_columns(task: str) -> tuple[ReportColumn, ...]:
    """The task's accuracy columns, the headline first (never empty)."""
    spec = task_spec(task)
    return spec.info.accuracy if spec is not None and spec.info.accuracy else _UNKNOWN


def accuracy_column(task: str, key: str) -> ReportColumn:
    """The accuracy column of ``task`` that shows the record field ``key``."""
    return next(c for c in accuracy_columns(task) if c.key == key)


def compute_key(task: str) -> str:
    """The GMACs field a budget is matched on: ``gmacs`` (the model's) or ``backbone_gmacs``."""
    spec = task_spec(task)
    return task_contract.compute_key(spec) if spec is not None else "gmacs"


def compute_name(task: str) -> str:
    """:func:`compute_key` in words: ``GMACs`` or ``backbone GMACs``."""
    spec = task_spec(task)
    return task_contract.compute_name(spec) if spec is not None else "GMACs"
