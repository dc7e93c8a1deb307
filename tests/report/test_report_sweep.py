"""The sweep report (issue 10): summary at each budget with the area under each curve over the
common range, per-budget tables, Pareto plots; cls top-1 and det/seg box/mask mAP."""
from __future__ import annotations

import pytest

from vitbench.report.curves import common_span, curve_area, curves
from vitbench.report.sweep import budget_records, budgets, render_sweep_markdown, summary_table, write_sweep_report

PNG = b"\x89PNG\r\n\x1a\n"


def _matched(make, sid, method, param, value, budget, gmacs, task="cls", **metrics):
    b = {"fraction": budget, "param": param, "value": value, "mode": "search", "baseline_gmacs": 10.0,
         "target_gmacs": 10.0 * budget, "tolerance_pct": 2.0, "counts": 7,
         "landed_gmacs": gmacs, "landed_off_pct": 100 * (gmacs / (10.0 * budget) - 1), "landed_within": True}
    return make(sid, method, {param: value}, task=task, match_gmacs=budget, budget=b, gmacs=gmacs,
                label=f"{method} ({param}={value})", **metrics)


@pytest.fixture
def sweep(make_record):
    return [
        make_record("b", "baseline", gmacs=10.0, top1_pct=80.0),
        _matched(make_record, "t9", "tome", "r", 3, 0.9, 9.0, top1_pct=79.0),
        _matched(make_record, "k9", "topk", "keep", 0.9, 0.9, 9.0, top1_pct=78.0),
        _matched(make_record, "t7", "tome", "r", 7, 0.7, 7.0, top1_pct=75.0),
        _matched(make_record, "k7", "topk", "keep", 0.7, 0.7, 7.0, top1_pct=76.0),
        _matched(make_record, "t5", "tome", "r", 12, 0.5, 5.0, top1_pct=65.0),
        make_record("k5", "topk", {}, status="error", match_gmacs=0.5, label="topk (at 0.5x GMACs)",
                    error="topk cannot reach F = 0.5"),
    ]


def test_runs_at_their_own_settings_get_their_own_section(sweep, make_record):
    """A store that holds a sweep and unmatched runs (a trained method at its own ratio) renders
    both: the unmatched rows are not dropped from the report."""
    own = make_record("i8", "ltm", {"ratio": 0.8}, gmacs=8.6, top1_pct=77.5, label="ibtm (ratio=0.8)")
    text = render_sweep_markdown([*sweep, own])
    section = text.split("### At their own settings (matched to no budget)", 1)[1]
    assert "ibtm (ratio=0.8)" in section and "77.50" in section and "baseline" in section
    assert "At their own settings" not in render_sweep_markdown(sweep)


def test_budgets_and_the_records_of_one_budget(sweep):
    assert budgets(sweep, "cls", "vitbench-fmnist-vit") == [0.9, 0.7, 0.5]
    assert [r["spec_id"] for r in budget_records(sweep, 0.7)] == ["b", "t7", "k7"]


def test_curve_area_is_the_mean_accuracy_over_the_common_range(sweep):
    cs = {c.name: c for c in curves(sweep, "cls", "vitbench-fmnist-vit")}
    assert sorted(cs["tome"].rows) == [0.5, 0.7, 0.9] and sorted(cs["topk"].rows) == [0.7, 0.9]
    span = common_span(list(cs.values()), "top1_pct", 10.0)
    assert span == pytest.approx((0.7, 0.9))  # topk failed at 0.5: the range both cover
    assert curve_area(cs["tome"], "top1_pct", 10.0, span) == pytest.approx((75 + 79) / 2)
    assert curve_area(cs["topk"], "top1_pct", 10.0, span) == pytest.approx((76 + 78) / 2)
    # over a range with an inner point the trapezoids add up: tome on 0.5..0.9
    whole = curve_area(cs["tome"], "top1_pct", 10.0, (0.5, 0.9))
    assert whole == pytest.approx(((65 + 75) / 2 * 0.2 + (75 + 79) / 2 * 0.2) / 0.4)
    assert curve_area(cs["topk"], "top1_pct", 10.0, (0.5, 0.9)) is None  # does not cover it


def test_summary_table(sweep):
    df = summary_table(sweep, "cls", "vitbench-fmnist-vit")
    assert list(df.columns) == ["Method", "F = 0.9", "F = 0.7", "F = 0.5", "Area ÷ range, F 0.70–0.90"]
    rows = {r["Method"]: r for r in df.to_dict("records")}
    assert (rows["tome"]["F = 0.9"], rows["tome"]["F = 0.5"]) == ("79.00", "65.00")
    assert rows["topk"]["F = 0.5"] == "failed"
    assert (rows["tome"]["Area ÷ range, F 0.70–0.90"], rows["topk"]["Area ÷ range, F 0.70–0.90"]) == ("77.00", "77.00")


def test_sweep_markdown_has_summary_plots_and_one_table_per_budget(sweep):
    md = render_sweep_markdown(sweep, plot_paths=("pareto_gmacs.png", "pareto_throughput.png"))
    assert md.index("### Summary") < md.index("### F = 0.9") < md.index("### F = 0.7") < md.index("### F = 0.5")
    assert "Baseline: Top-1 (%) 80.00, 10.000 GMACs." in md
    assert "![Pareto: accuracy vs GMACs](pareto_gmacs.png)" in md
    section_05 = md[md.index("### F = 0.5"):]
    assert "tome (r=12; matched 0.5x GMACs)" in section_05 and "tome (r=3" not in section_05
    assert "- topk (at 0.5x GMACs): topk cannot reach F = 0.5" in section_05
    assert "r=12 searched on the GMACs count (7 settings evaluated)" in section_05


def test_write_sweep_report_writes_both_pareto_pngs(sweep, tmp_path):
    md, pngs = write_sweep_report(sweep, tmp_path / "report.md")
    assert md.read_text().startswith("# vitbench sweep")
    assert [p.name for p in pngs] == ["pareto_gmacs.png", "pareto_throughput.png"]
    assert all(p.read_bytes()[:8] == PNG for p in pngs)


def test_segmentation_sweeps_compare_box_and_mask_map_on_backbone_gmacs(make_record):
    recs = [make_record("b", "baseline", task="seg", box_map=0.40, mask_map=0.35, backbone_gmacs=2.0, gmacs=5.0)]
    for sid, budget, box, mask in (("a", 0.9, 0.39, 0.34), ("c", 0.6, 0.33, 0.30)):
        recs.append(_matched(make_record, sid, "tome", "r", 4, budget, 4.0, task="seg", box_map=box,
                             mask_map=mask, backbone_gmacs=2.0 * budget))
    model = "vitbench-fmnist-vit"
    box = summary_table(recs, "seg", model, "box_map")
    mask = summary_table(recs, "seg", model, "mask_map")
    assert list(box.iloc[0])[:3] == ["tome", "0.390", "0.330"] and list(mask.iloc[0])[:3] == ["tome", "0.340", "0.300"]
    md = render_sweep_markdown(recs)
    assert "Box mAP at each budget:" in md and "Mask mAP at each budget:" in md
    assert "backbone GMACs" in md


def test_summary_keeps_accuracy_when_no_common_range_exists(make_record):
    # one successful budget per method: accuracy is shown, the area is n/a (no range to integrate)
    recs = [make_record("b", "baseline", gmacs=10.0, top1_pct=80.0),
            _matched(make_record, "t9", "tome", "r", 3, 0.9, 9.0, top1_pct=79.0),
            make_record("t5", "tome", {}, status="error", match_gmacs=0.5, label="tome (at 0.5x GMACs)",
                        error="tome cannot reach F = 0.5")]
    df = summary_table(recs, "cls", "vitbench-fmnist-vit")
    assert df.to_dict("records") == [{"Method": "tome", "F = 0.9": "79.00", "F = 0.5": "failed", "Area ÷ range": "n/a"}]
    assert "Top-1 (%) at each budget:" in render_sweep_markdown(recs)


def _curve(*points):
    """``(batch, img/s)`` pairs as a record's ``batch_curve``."""
    return [{"batch_size": b, "throughput_img_s": tp, "latency_ms": 1e3 * b / tp, "flag_reason": None}
            for b, tp in points]


def test_a_sweep_timed_at_several_batch_sizes_draws_speed_up_against_batch_a_panel_per_budget(sweep, tmp_path):
    from vitbench.report.batches import _planned
    from vitbench.report.sweep import budget_parts

    curves = {"b": ((1, 100.0), (8, 200.0)), "t9": ((1, 90.0), (8, 220.0)), "k9": ((1, 110.0), (8, 210.0)),
              "t7": ((1, 80.0), (8, 260.0))}
    timed = [dict(r, batch_curve=_curve(*curves[r["spec_id"]])) if r["spec_id"] in curves else r for r in sweep]
    md, pngs = write_sweep_report(timed, tmp_path / "report.md")
    batch_png = tmp_path / "report-speedup-vs-batch.png"
    assert batch_png in pngs and batch_png.read_bytes()[:8] == PNG
    assert "](report-speedup-vs-batch.png)" in md.read_text()
    panels = [title for part, recs in budget_parts(timed) for title, _ in _planned(recs, part)]
    assert panels == ["cls · vitbench-fmnist-vit at F = 0.9: speed-up vs batch size",
                      "cls · vitbench-fmnist-vit at F = 0.7: speed-up vs batch size"]  # F = 0.5: no curve
    # per budget, each method against the one baseline: tome at 0.9 is slower at 1, faster at 8
    assert "- tome (r=3; matched 0.9x GMACs): faster than the baseline from batch 8 on (0.90x at 1)." in md.read_text()


def test_a_sweep_without_batch_curves_draws_no_batch_plot(sweep, tmp_path):
    _, pngs = write_sweep_report(sweep, tmp_path / "report.md")
    assert not (tmp_path / "report-speedup-vs-batch.png").exists() and len(pngs) == 2


def test_the_summary_says_what_each_method_trained(sweep):
    trained = [dict(r) for r in sweep]
    for r in trained:
        if r.get("method") == "topk":
            r.update(trained="fine-tuned", train_images=1000, train_stages=[{"iters": 32}])
    df = summary_table(trained, "cls", "vitbench-fmnist-vit")
    rows = {r["Method"]: r for r in df.to_dict("records")}
    assert list(df.columns)[:2] == ["Method", "Trained"]
    assert (rows["tome"]["Trained"], rows["topk"]["Trained"]) == ("none", "32 steps on 1,000 images")
