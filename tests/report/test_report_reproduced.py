"""Whether a reproduced row matched its source (issue 38 item 4): top-1 within the stated
tolerance on the whole evaluation set, the speed-up ratio within its tolerance, and a check the
run cannot make said so instead of passing."""
from __future__ import annotations

import pytest

from vitbench.report.attached import published_section
from vitbench.report.reproduced import SPEEDUP_TOLERANCE, TOP1_TOLERANCE_PP, check_row

ROW = {"id": "tome-vit-s-r13", "method": "tome", "model": "vit_small_patch16_224", "params": "r=13",
       "source": "a README", "paper_top1": 79.30, "paper_baseline_top1": 81.41, "paper_gflops": None,
       "paper_baseline_gflops": None, "paper_fraction": None, "paper_img_s": 1564, "paper_baseline_img_s": 953,
       "paper_gpu": "V100", "gmacs_reason": "", "note": "", "eval_images": 50_000}


def _records(base_top1=81.2, top1=79.0, speedup=1.7, images=50_000):
    env = {"device": "NVIDIA H100"}
    return [{"method": "baseline", "status": "ok", "top1_pct": base_top1, "num_images": images, "speedup": 1.0,
             "env": env, "batch_size": 32},
            {"method": "tome", "status": "ok", "top1_pct": top1, "num_images": images, "speedup": speedup,
             "env": env, "batch_size": 32}]


def test_the_defaults_are_half_a_point_and_fifteen_percent():
    assert (TOP1_TOLERANCE_PP, SPEEDUP_TOLERANCE) == (0.5, 0.15)


def test_a_row_within_its_tolerances_is_ok():
    checks = check_row(ROW, _records())
    assert [(c.what, c.status) for c in checks] == [("baseline top-1", "ok"), ("tome top-1", "ok"),
                                                    ("speed-up", "ok")]
    assert checks[1].detail == "measured 79.00 %, the source 79.30 % (-0.30 points; tolerance 0.5)"
    assert checks[2].detail.startswith("measured 1.70x on NVIDIA H100 at batch 32, the source 1.64x on a V100 "
                                       "(+3.6%; tolerance 15%")


@pytest.mark.parametrize("records, what", [
    (_records(top1=78.7), "tome top-1"),
    (_records(base_top1=82.0), "baseline top-1"),
    (_records(speedup=1.3), "speed-up"),
])
def test_a_row_outside_a_tolerance_is_off(records, what):
    assert [c.what for c in check_row(ROW, records) if c.status == "off"] == [what]


def test_a_row_may_state_its_own_tolerances():
    row = dict(ROW, top1_tolerance_pp=1.0, speedup_tolerance=0.3)
    assert all(c.status == "ok" for c in check_row(row, _records(top1=78.4, speedup=1.3)))


def test_a_top1_on_part_of_the_set_or_without_accuracy_or_throughput_is_not_checked():
    checks = check_row(ROW, _records(images=1000))
    assert [c.status for c in checks[:2]] == ["not checked"] * 2
    assert "on 1000 images, the source on 50,000 (leave --limit out to check it)" in checks[1].detail
    records = [{k: v for k, v in r.items() if k not in ("top1_pct", "speedup")} for r in _records()]
    checks = check_row(ROW, records)
    assert all(c.status == "not checked" for c in checks)
    assert "add accuracy to --metrics" in checks[0].detail and "add throughput to --metrics" in checks[2].detail
    assert all(c.status == "not checked" for c in check_row(ROW, []))


def test_a_source_without_numbers_gives_nothing_to_check():
    row = dict(ROW, paper_top1=None, paper_baseline_top1=None, paper_img_s=None)
    assert check_row(row, _records()) == []
    assert "Checked against the source" not in published_section(row, _records())


def test_the_published_section_says_what_was_checked():
    text = published_section(ROW, _records(top1=78.0))
    assert "Checked against the source:" in text
    assert "- tome top-1: **off**, measured 78.00 %, the source 79.30 % (-1.30 points; tolerance 0.5)." in text
