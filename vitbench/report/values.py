"""Numbers read out of a record: what a report may compute with (a finite float), else ``None``."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["metric", "number"]


def number(value: Any) -> float | None:
    """``value`` as a finite float, else ``None`` (null, NaN, infinite, a bool, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric(rec: Mapping[str, Any] | None, key: str) -> float | None:
    """``rec[key]`` as a finite float, else ``None`` (missing, null, NaN, not a number)."""
    return None if rec is None else number(rec.get(key))
