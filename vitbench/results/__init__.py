"""Results: the append-only JSONL store of run records (see :mod:`vitbench.results.store`)."""
from __future__ import annotations

from vitbench.results.store import (
    FINISHED_STATUSES,
    CorruptLine,
    ResultStore,
    latest_records,
    to_jsonable,
)

__all__ = ["FINISHED_STATUSES", "CorruptLine", "ResultStore", "latest_records", "to_jsonable"]
