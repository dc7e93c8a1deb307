"""Where a speed-up begins (``--batch-sizes``, issue 38 item 2): the speed-up at each batch size
against the baseline of the same seed, the batch size from which a method is faster, the table
and sentences under a report's table, and the speed-up-vs-batch plot."""
from __future__ import annotations

import pytest

from vitbench.report import render_markdown, write_report
from vitbench.report.batches import batch_lines, break_even, curve_speedups, has_curves, plot_speedup_vs_batch



def make(spec_id, method, params=None, seed=0, **metrics):
    return {"spec_id": spec_id, "task": "cls", "model": "vitbench-fmnist-vit", "data": "fashion-mnist",
            "method": method, "params": params or {}, "seed": seed, "status": "ok", "num_classes": 10,
            "attention_kernel": "fused (SDPA)", "started_at": "2026-11-28T10:00:00",
            "finished_at": "2026-11-28T10:01:00", **metrics}


def _curve(*points, flagged=()):
    """``(batch, img/s)`` pairs as a record's ``batch_curve`` (milliseconds from them)."""
    return [{"batch_size": b, "throughput_img_s": tp, "throughput_spread_img_s": 0.0,
             "latency_ms": 1e3 * b / tp, "latency_spread_ms": 0.0,
             "flag_reason": "spread 30 % of the median" if b in flagged else None} for b, tp in points]


def _records(seed=0, tome=(50.0, 150.0, 400.0), ppt=(40.0, 90.0, 190.0)):
    base = make("b", "baseline", seed=seed, batch_curve=_curve((1, 100.0), (4, 200.0), (16, 200.0)))
    return [base,
            make("t", "tome", {"r": 8}, seed=seed, batch_curve=_curve(*zip((1, 4, 16), tome))),
            make("p", "ppt", {"r": 8}, seed=seed, batch_curve=_curve(*zip((1, 4, 16), ppt)))]


@pytest.mark.parametrize("speedups, batch", [
    ({1: 0.5, 4: 0.75, 16: 2.0}, 16),
    ({1: 1.1, 4: 1.2, 16: 2.0}, 1),
    ({1: 0.5, 4: 1.2, 16: 0.9}, None),  # faster at 4 only: it does not pay from there on
    ({1: 0.5, 4: 1.0, 16: 0.9}, None),  # equal is not faster
    ({1: 0.9, 4: 1.01, 16: 1.3}, 4),
    ({}, None),
])
def test_the_break_even_batch_is_the_smallest_from_which_every_larger_one_is_faster(speedups, batch):
    assert break_even(speedups) == batch


def test_speed_ups_are_taken_against_the_baseline_of_the_same_seed_and_their_median_shown():
    from vitbench.report.tables import ok_rows

    # seed 1's baseline is twice as fast: against it tome's seed-1 curve is half as fast
    records = _records(0) + [dict(r, spec_id=r["spec_id"] + "1") for r in _records(1)]
    records[3]["batch_curve"] = _curve((1, 200.0), (4, 400.0), (16, 400.0))
    rows, base = ok_rows(records, "cls", "vitbench-fmnist-vit")
    tome = next(r for r in rows if r["method"] == "tome")
    assert curve_speedups(tome, base) == pytest.approx({1: (0.5 + 0.25) / 2, 4: (0.75 + 0.375) / 2,
                                                        16: (2.0 + 1.0) / 2})


def test_the_executor_s_speed_up_is_taken_where_a_record_has_one():
    records = _records()
    records[1]["batch_curve"][0]["speedup"] = 0.9  # what the executor computed against its baseline
    assert curve_speedups(records[1], records[0])[1] == 0.9


def test_the_report_names_where_each_method_pays_and_shows_every_cell():
    text = render_markdown(_records())
    assert "**Speed-up by batch size**" in text
    assert "| Method | bs 1 | bs 4 | bs 16 |" in text
    assert "| baseline | 100 img/s, 10.0 ms | 200 img/s, 20.0 ms | 200 img/s, 80.0 ms |" in text
    assert "| tome (r=8) | 0.50x, 20.0 ms | 0.75x, 26.7 ms | 2.00x, 40.0 ms |" in text
    assert "- tome (r=8): faster than the baseline from batch 16 on (0.50x at 1, 0.75x at 4)." in text
    assert ("- ppt (r=8): slower than the baseline at every batch size measured (1 to 16; at best "
            "0.95x, at batch 16).") in text


def test_a_method_faster_everywhere_and_one_faster_only_in_between_are_said_so():
    lines = "\n".join(batch_lines(["baseline", "a", "b"], _records(tome=(150.0, 300.0, 300.0),
                                                                    ppt=(50.0, 300.0, 100.0)), None))
    assert "No baseline was timed at these batch sizes" in lines
    recs = _records(tome=(150.0, 300.0, 300.0), ppt=(50.0, 300.0, 100.0))
    lines = "\n".join(batch_lines(["baseline", "a", "b"], recs, recs[0]))
    assert "- a: faster than the baseline at every batch size measured (1 to 16)." in lines
    assert "- b: faster only at batch 4, and slower at the largest measured (0.50x at 16)." in lines


def test_a_doubted_point_is_marked_in_its_cell_and_explained():
    recs = _records()
    recs[0]["batch_curve"] = _curve((1, 100.0), (4, 200.0), (16, 200.0), flagged=(4,))
    lines = batch_lines(["baseline", "tome", "ppt"], recs, recs[0])
    row = next(x for x in lines if x.startswith("| tome"))
    assert row == "| tome | 0.50x, 20.0 ms | 0.75x, 26.7 ms † | 2.00x, 40.0 ms |"
    assert any(x.startswith("† At this batch size") for x in lines)
    assert "- baseline, batch 4: spread 30 % of the median" in lines  # the reason, point by point


def test_without_curves_the_report_has_no_batch_section_and_no_batch_plot(tmp_path, records):
    assert not has_curves(records)
    assert "Speed-up by batch size" not in render_markdown(records)
    write_report(records, tmp_path / "report.md")
    assert not (tmp_path / "report-speedup-vs-batch.png").exists()
    assert plot_speedup_vs_batch(records, tmp_path / "x.png") is None and not (tmp_path / "x.png").exists()


def test_write_report_draws_the_speed_up_against_batch_size_and_links_it(tmp_path):
    md, _ = write_report(_records(), tmp_path / "report.md")
    png = tmp_path / "report-speedup-vs-batch.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![Speed-up over the baseline against batch size](report-speedup-vs-batch.png)" in md.read_text()


def test_only_a_baseline_curve_draws_nothing():
    base = _records()[0]
    assert not has_curves([base])
