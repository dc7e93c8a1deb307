"""Words on whether each method beats the controls at its budget (docs/measuring.md, "Against the
controls"): the interval of the difference against a hand computation, the three verdicts, seeds,
a control under its budget, and nothing where no control ran at the same budget."""
from __future__ import annotations

import math

import pytest

from vitbench.report import render_markdown
from vitbench.report.controls import control_lines, difference_interval, is_control


#: a downsample grid under its budget, as the search records it
BELOW = {"fraction": 0.7, "param": "keep", "value": 0.6683, "mode": "search", "baseline_gmacs": 0.35,
         "target_gmacs": 0.245, "tolerance_pct": 2.0, "counts": 18, "calibrated_gmacs": 0.2391,
         "calibrated_off_pct": -2.4, "landed_gmacs": 0.2391, "landed_off_pct": -2.4, "landed_within": False}


def _row(make_record, spec_id, method, top1, params=None, F=0.7, **extra):
    return make_record(spec_id, method, params or {"keep": 0.7}, top1_pct=top1, num_images=1000, gmacs=0.25,
                       match_gmacs=F, **extra)


def test_the_interval_of_two_single_runs_is_that_of_two_proportions(make_record):
    a, b = _row(make_record, "t", "tome", 90.0), _row(make_record, "d", "downsample", 85.0)
    half = 100 * 1.959964 * math.sqrt(0.9 * 0.1 / 1000 + 0.85 * 0.15 / 1000)
    assert difference_interval(a, b, "top1_pct") == pytest.approx(half, rel=1e-5)
    assert difference_interval({**a, "box_map": 30.0}, {**b, "box_map": 29.0}, "box_map") is None  # no proportion


def test_over_seeds_the_interval_is_welchs_with_students_t(make_record):
    a = {**_row(make_record, "t", "tome", 90.0), "n_seeds": 3, "top1_pct_seed_std": 0.5}
    b = {**_row(make_record, "d", "random", 89.0), "n_seeds": 3, "top1_pct_seed_std": 0.3}
    half = 4.302653 * math.sqrt(0.25 / 3 + 0.09 / 3)  # t(0.975, 2)
    assert difference_interval(a, b, "top1_pct") == pytest.approx(half, rel=1e-5)


def test_each_method_is_said_to_beat_or_not_each_control_at_its_budget(make_record):
    assert is_control("random") and is_control("downsample") and not is_control("topk")
    rows = [make_record("b", "baseline", top1_pct=91.0, num_images=1000, gmacs=0.35),
            _row(make_record, "t", "tome", 90.1, {"r": 9}),
            _row(make_record, "k", "topk", 84.5),
            _row(make_record, "p", "ppt", 88.0, {"r": 3}),
            _row(make_record, "d", "downsample", 85.2, budget=BELOW),
            _row(make_record, "r", "random", 89.8)]
    lines = control_lines("cls", ["baseline", "tome", "topk", "ppt", "downsample", "random"], rows)
    text = "\n".join(lines)
    assert lines[0].startswith("**Against the controls**")
    assert "- tome: beats downsample (+4.90 pp, 95 % interval ±2.88, which ran at -2.4 % of the budget's GMACs); " \
           "**does not beat** random (+0.30 pp, 95 % interval ±2.64)." in text
    assert "- topk: **does not beat** downsample (-0.70 pp" in text and "**is worse than** random (-5.30 pp" in text
    assert "- ppt: **does not beat** downsample (+2.80 pp, 95 % interval ±2.98" in text  # inside the interval
    assert not any(line.startswith(("- baseline", "- downsample", "- random")) for line in lines)  # controls judge, are not judged
    md = render_markdown(rows)
    assert "**Against the controls**" in md
    assert ("(**outside the 2 % tolerance**: its knob moves in steps, and the nearest setting under the budget "
            "was taken)") in md


def test_nothing_is_said_without_a_control_at_the_same_budget(make_record):
    rows = [_row(make_record, "t", "tome", 90.1, {"r": 9}, F=0.7), _row(make_record, "d", "downsample", 85.0, F=0.5)]
    assert control_lines("cls", ["tome", "downsample"], rows) == []
    plain = [make_record("t", "tome", {"r": 9}, top1_pct=90.0, num_images=1000),
             make_record("d", "downsample", {"keep": 0.7}, top1_pct=85.0, num_images=1000)]
    assert control_lines("cls", ["tome", "downsample"], plain) == []  # not matched: different compute


def test_a_method_off_its_budget_is_said_not_to_be_at_the_controls_compute(make_record):
    """A trained method that landed outside the tolerance (LTMP's thresholds overshooting) is still
    set beside the controls, but its line says it did not run at their compute."""
    off = {**BELOW, "param": "gmacs_fraction", "mode": "fraction", "landed_gmacs": 0.1855,
           "landed_off_pct": -24.2, "landed_within": False}
    rows = [_row(make_record, "l", "ltmp", 89.6, {"gmacs_fraction": 0.7}, budget=off),
            _row(make_record, "r", "random", 89.5)]
    text = "\n".join(control_lines("cls", ["ltmp", "random"], rows))
    assert ("- ltmp (ran at -24.2 % of the budget's GMACs, outside the tolerance: **not at the controls' "
            "compute**): **does not beat** random (+0.10 pp") in text
