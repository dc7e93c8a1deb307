"""What a row says besides its numbers (docs/measuring.md, "What a row says"): its settings in the
label, a warning when methods ran at unequal compute, images and a 95 % interval, where its
weights came from, a methodology of what was measured, top-5 only where it means something and
no empty plot panels."""
from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from vitbench.run.plan import build_plan
from vitbench.report import comparison_table, render_markdown, write_report
from vitbench.report.row_facts import interval_pct, row_label, wilson
from vitbench.tasks.cls.weights_from import default_model_weights
from vitbench.tasks.identity import file_digest, weights_from

CLS = ("cls", "vitbench-fmnist-vit")


def _plan(**kw):
    return build_plan(task="cls", model="test_vit", methods=["tome", "ppt"], data=None, overrides={},
                      metrics=["gmacs"], batch_size=1, device="cpu", seed=0, **kw)


def test_labels_carry_the_budget_knob_at_its_default_too():
    base, tome, ppt = _plan()
    assert (base.label, tome.label, ppt.label) == ("baseline", "tome (r=16)", "ppt (r=50)")
    assert "label" not in asdict(tome)  # a property: never hashed into the spec id
    matched = _plan(match_gmacs=0.5)[1]
    assert matched.label == "tome (matched 0.5x GMACs)"
    assert matched.matched_label({**matched.params, "r": 7}) == "tome (r=7; matched 0.5x GMACs)"


def test_an_old_records_label_gets_its_knob_and_budget():
    params = {"r": 16, "prop_attn": True, "trace_source": False}
    assert row_label({"method": "tome", "label": "tome", "params": params}) == "tome (r=16)"
    assert row_label({"method": "tome", "label": "tome (prop_attn=false)", "params": {**params, "prop_attn": False}}) \
        == "tome (r=16, prop_attn=false)"
    old_matched = {"method": "tome", "label": "tome (r=7)", "params": {**params, "r": 7}, "match_gmacs": 0.5,
                   "budget": {"param": "r"}}
    assert row_label(old_matched) == "tome (r=7; matched 0.5x GMACs)"
    assert row_label({"method": "ppt", "label": "ppt (order=\"x\")", "params": {"r": 50, "order": "x"}}) \
        == "ppt (r=50, order=\"x\")"  # "order=" is not the knob "r="


def _three(make_record, tome_gmacs, **extra):
    return [make_record("b", "baseline", top1_pct=85.5, gmacs=0.0321),
            make_record("t", "tome", {"r": 16}, label="tome (r=16)", top1_pct=57.0, gmacs=tome_gmacs, **extra),
            make_record("p", "ppt", {"r": 50}, label="ppt (r=50)", top1_pct=76.5, gmacs=0.0159, **extra)]


def test_unequal_compute_is_warned_about_under_the_table(make_record):
    md = render_markdown(_three(make_record, 0.00637))
    warning = next(line for line in md.splitlines() if "different compute" in line)
    assert "tome (r=16) at 0.00637" in warning and "ppt (r=50) at 0.0159" in warning
    assert "--match-gmacs F" in warning
    assert md.index("| ppt (r=50)") < md.index("different compute")  # under the table
    assert "different compute" not in render_markdown(_three(make_record, 0.0160))  # within 5 %


def test_matched_runs_get_no_unequal_compute_warning(make_record):
    assert "different compute" not in render_markdown(_three(make_record, 0.00637, match_gmacs=0.5))


def test_the_wilson_interval_matches_a_hand_computation():
    # k = 171 of n = 200, z = 1.959964: centre (0.855 + z²/400) / (1 + z²/200), half-width
    # z / (1 + z²/200) * sqrt(0.855 * 0.145 / 200 + z²/160000)
    z = 1.959963984540054
    centre = (0.855 + z * z / 400) / (1 + z * z / 200)
    half = z / (1 + z * z / 200) * math.sqrt(0.855 * 0.145 / 200 + z * z / 160000)
    assert wilson(171, 200) == pytest.approx((centre - half, centre + half))
    assert wilson(171, 200) == pytest.approx((0.79951, 0.89711), abs=1e-5)
    assert interval_pct(100.0, 200) == pytest.approx((98.115, 100.0), abs=1e-3)  # stays within 0-100
    assert interval_pct(85.5, None) is None


def test_rows_show_their_images_and_the_interval(make_record):
    recs = [make_record("b", "baseline", top1_pct=85.5, num_images=200, gmacs=1.0),
            make_record("t", "tome", {"r": 16}, label="tome (r=16)", top1_pct=57.0, num_images=200, gmacs=0.98),
            make_record("o", "topk", {"keep": 0.7}, label="topk (keep=0.7)", top1_pct=70.0, gmacs=0.99)]
    rows = {r["Method"]: r for r in comparison_table(recs, *CLS).to_dict("records")}
    assert rows["baseline"]["Images"] == "200" and rows["baseline"]["Top-1 (%)"] == "85.50 [80.0, 89.7]"
    assert rows["tome (r=16)"]["Top-1 (%)"] == "57.00 [50.1, 63.7]"
    assert rows["topk (keep=0.7)"]["Images"] == "n/a" and rows["topk (keep=0.7)"]["Top-1 (%)"] == "70.00"


def test_mAP_gets_images_but_no_interval(make_record):
    recs = [make_record("b", "baseline", task="det", model="m", box_map=0.301, num_images=50),
            make_record("t", "tome", {"r": 8}, task="det", model="m", box_map=0.290, num_images=50)]
    rows = comparison_table(recs, "det", "m").to_dict("records")
    assert [(r["Images"], r["Box mAP"]) for r in rows] == [("50", "0.301"), ("50", "0.290")]
    assert "no proportion of images" in render_markdown(recs)


def test_top5_only_for_fifty_classes_or_more(make_record):
    ten = [make_record("b", "baseline", top1_pct=85.5, top5_pct=100.0, num_classes=10)]
    thousand = [make_record("b", "baseline", top1_pct=81.2, top5_pct=95.1, num_classes=1000)]
    assert "Top-5 (%)" not in comparison_table(ten, *CLS).columns
    assert list(comparison_table(thousand, *CLS)["Top-5 (%)"]) == ["95.10"]


def _spec(**kw):
    fields = dict(weights=None, checkpoint=None, pretrained=False, model="deit_tiny_patch16_224")
    return SimpleNamespace(**{**fields, **kw})


def test_weights_from_names_each_provenance(tmp_path: Path):
    ckpt = tmp_path / "deit.pth"
    ckpt.write_bytes(b"weights")
    digest = file_digest(ckpt)
    assert weights_from(_spec(weights=f"sha256={digest}", checkpoint=str(ckpt))) == \
        f"checkpoint deit.pth (sha256 {digest[:12]})"
    assert weights_from(_spec(weights="init_seed=3")) == "random init (seed 3)"
    assert weights_from(_spec(pretrained=True)) == "timm pretrained deit_tiny_patch16_224.fb_in1k"
    shipped = default_model_weights()
    assert shipped.startswith(("embedded default vitbench-fmnist-vit (sha256 ",
                               "default vitbench-fmnist-vit retrained here"))
    assert weights_from(_spec(model="vitbench-fmnist-vit"), default=shipped) == shipped


def test_shared_weights_are_a_line_and_different_ones_a_column(make_record):
    same = [make_record("b", "baseline", top1_pct=80.0, weights_from="random init (seed 0)"),
            make_record("t", "tome", {"r": 4}, top1_pct=70.0, weights_from="random init (seed 0)")]
    md = render_markdown(same)
    assert "Weights of every row: random init (seed 0)." in md and "Weights" not in comparison_table(same, *CLS)
    other = [same[0], {**same[1], "weights_from": "checkpoint a.pth (sha256 0123456789ab)"}]
    rows = comparison_table(other, *CLS).to_dict("records")
    assert [r["Weights"] for r in rows] == ["random init (seed 0)", "checkpoint a.pth (sha256 0123456789ab)"]
    old = [{k: v for k, v in r.items() if k != "weights_from"} for r in same]  # a store from before
    assert "Weights: n/a (not recorded" in render_markdown(old)


def _methodology(md: str) -> str:
    return md.split("## Methodology")[1].split("\n## ")[0]


def test_methodology_says_only_what_was_measured(make_record):
    gmacs_only = _methodology(render_markdown([make_record("b", "baseline", gmacs=1.0)]))
    assert "**GMACs**" in gmacs_only
    assert not any(w in gmacs_only for w in ("IB loss", "Throughput**", "Latency**", "mmpretrain", "Wilson"))
    with_ib = _methodology(render_markdown([make_record("b", "baseline", top1_pct=80.0, ib_loss=0.1, ib_bound=0.5)]))
    assert "**IB loss**" in with_ib and "Wilson" in with_ib and "**GMACs**" not in with_ib


def test_a_plot_without_accuracy_or_timing_is_not_drawn(make_record, tmp_path, monkeypatch):
    import vitbench.report.plot as plot

    axes = []
    real = plot.Figure.savefig
    monkeypatch.setattr(plot.Figure, "savefig",
                        lambda self, *a, **kw: axes.append(len(self.axes)) or real(self, *a, **kw))
    gmacs_acc = [make_record("b", "baseline", top1_pct=80.0, gmacs=1.0),
                 make_record("t", "tome", {"r": 4}, top1_pct=70.0, gmacs=0.5)]
    md_path, png = write_report(gmacs_acc, tmp_path / "a.md")
    assert png is not None and axes == [1]  # accuracy vs GMACs only: no empty throughput panel
    assert "## Plot" in md_path.read_text()
    gmacs_only = [{k: v for k, v in r.items() if k != "top1_pct"} for r in gmacs_acc]
    md_path, png = write_report(gmacs_only, tmp_path / "b.md")
    assert png is None and not (tmp_path / "b.png").exists() and "## Plot" not in md_path.read_text()
