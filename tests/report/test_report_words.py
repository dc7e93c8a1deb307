"""The report's sentence helpers: distinct record values, joined."""
from __future__ import annotations

from vitbench.report.words import distinct, joined


def test_distinct_keeps_first_seen_order_and_drops_empty_values():
    assert distinct(["b", None, "a", "", "b", [], {}, 3]) == ["b", "a", "3"]


def test_joined_marks_values_that_differ_between_records():
    assert joined([]) == "n/a" and joined(["x"]) == "x"
    assert joined(["x", "y"]) == "x; y (differs between records)"
