"""The note under a table whose timings ran with ``--quick`` or ``--repeats N`` (issue 23, item 3)."""
from __future__ import annotations

from vitbench.report.timed_how import repeats_notes, timed_how_notes


def test_quick_rows_are_a_fast_look():
    rows = [{"timing_repeats": 3}, {"per_seed": [{"timing_repeats": 3}, {"timing_repeats": 3}]}]
    assert repeats_notes(["baseline", "tome"], rows) == [
        "Timed with 3 repeats (--quick): a fast look, not for publication.", ""]
    assert timed_how_notes(["baseline", "tome"], rows)[0].startswith("Timed with 3 repeats (--quick)")


def test_many_repeats_are_said_without_the_warning_and_mixed_rows_are_listed():
    assert repeats_notes(["baseline"], [{"timing_repeats": 50}]) == ["Timed with 50 repeats (--repeats 50).", ""]
    lines = repeats_notes(["baseline", "tome"], [{"timing_repeats": 5}, {}])
    assert lines[0].startswith("Timed with fewer or more repeats than the defaults")
    assert "- baseline: 5 repeats (--repeats 5): a fast look, not for publication" in lines


def test_default_repeats_say_nothing():
    assert repeats_notes(["baseline", "tome"], [{"throughput_repeats": 10}, {}]) == []
