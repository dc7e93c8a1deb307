"""How the reports put record values into sentences: the distinct values, joined."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["distinct", "joined"]


def distinct(values: Iterable[Any]) -> list[str]:
    """The distinct non-empty values as strings, in first-seen order."""
    out: dict[str, None] = {}
    for v in values:
        if v not in (None, "", [], {}):
            out.setdefault(str(v), None)
    return list(out)


def joined(values: list[str]) -> str:
    """One value, or all of them marked as differing between records; ``n/a`` for none."""
    if not values:
        return "n/a"
    return values[0] if len(values) == 1 else "; ".join(values) + " (differs between records)"
