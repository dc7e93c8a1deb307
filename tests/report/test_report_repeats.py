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


def test_a_quick_row_and_a_full_row_of_one_setting_are_told_apart(make_record):
    from vitbench.report import comparison_table

    base = make_record("b", "baseline", top1_pct=80.0, gmacs=4.6, throughput_img_s=100.0, batch_size=8)
    quick = make_record("q", "tome", {"r": 4}, top1_pct=79.0, gmacs=3.0, throughput_img_s=140.0,
                        batch_size=8, timing_repeats=3)
    full = make_record("f", "tome", {"r": 4}, top1_pct=79.0, gmacs=3.0, throughput_img_s=150.0, batch_size=8)
    seven = make_record("s", "tome", {"r": 4}, top1_pct=79.0, gmacs=3.0, throughput_img_s=150.0,
                        batch_size=8, timing_repeats=7)
    methods = list(comparison_table([base, quick, full, seven], "cls", "vitbench-fmnist-vit")["Method"])
    assert methods == ["baseline", "tome (r=4) [--quick]", "tome (r=4) [default repeats]",
                       "tome (r=4) [--repeats 7]"]
