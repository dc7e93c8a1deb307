"""The comparison table: baseline first, deltas against it, "n/a" where nothing was measured."""
from __future__ import annotations

from vitbench.report import comparison_table
from vitbench.report.tables import method_label

CLS = ("cls", "vitbench-fmnist-vit")
DET = ("det", "deit_small_patch16_224")


def by_method(df):
    return {row["Method"]: row for row in df.to_dict("records")}


def test_columns_follow_the_report_shape(records):
    df = comparison_table(records, *CLS)
    assert list(df.columns) == [
        "Method", "Params", "Top-1 (%)", "Top-5 (%)", "ΔTop-1 (pp)", "GMACs", "GMACs ↓ (%)",
        "Throughput (img/s, bs=64)", "Speed-up (×)", "Efficiency", "Latency bs=1 (ms)",
        "IB loss", "IB bound",
    ]


def test_baseline_first_then_methods_in_store_order_latest_record_only(records):
    df = comparison_table(records, *CLS)
    # ibtm failed first, then succeeded: one row, from the newer record; failures not in table
    assert list(df["Method"]) == ["baseline", "tome (r=13)", "ibtm (r=0.7)"]
    # the baseline is first even when it is not first in the store
    df = comparison_table(records[1:2] + records[0:1], *CLS)
    assert list(df["Method"]) == ["baseline", "tome (r=13)"]


def test_deltas_against_the_baseline(records):
    rows = by_method(comparison_table(records, *CLS))
    base, tome, ibtm = rows["baseline"], rows["tome (r=13)"], rows["ibtm (r=0.7)"]
    assert base["Top-1 (%)"] == "81.20"
    assert (base["ΔTop-1 (pp)"], base["GMACs ↓ (%)"]) == ("0.00", "0.0")
    assert tome["Top-1 (%)"] == "80.68"
    assert tome["ΔTop-1 (pp)"] == "-0.52"
    assert tome["GMACs"] == "2.706"
    assert tome["GMACs ↓ (%)"] == "41.2"  # 1 - 2.706 / 4.60
    assert ibtm["ΔTop-1 (pp)"] == "+0.30"
    assert ibtm["GMACs ↓ (%)"] == "32.6"
    assert base["Params"] == "22.05M" and ibtm["Params"] == "22.10M"


def test_spread_speedup_and_efficiency(records):
    rows = by_method(comparison_table(records, *CLS))
    base, tome, ibtm = rows["baseline"], rows["tome (r=13)"], rows["ibtm (r=0.7)"]
    assert ibtm["GMACs"] == "3.100 ± 0.030"  # input dependent: mean ± std
    assert base["Throughput (img/s, bs=64)"] == "100.0 ± 2.0"
    # no speed-up recorded: 162 / 100 from the table; efficiency = 1.62 / (4.60 / 2.706)
    assert (tome["Speed-up (×)"], tome["Efficiency"]) == ("1.62", "0.95")
    # recorded by the executor: used as they are
    assert (ibtm["Speed-up (×)"], ibtm["Efficiency"]) == ("1.41", "0.95")
    assert (base["Speed-up (×)"], base["Efficiency"]) == ("1.00", "1.00")


def test_missing_metrics_are_na(records):
    rows = by_method(comparison_table(records, *CLS))
    ibtm, tome = rows["ibtm (r=0.7)"], rows["tome (r=13)"]
    assert ibtm["Top-5 (%)"] == "n/a"
    assert ibtm["Throughput (img/s, bs=64)"] == "n/a"
    assert ibtm["Latency bs=1 (ms)"] == "n/a"
    assert (tome["IB loss"], tome["IB bound"]) == ("n/a", "n/a")
    assert (ibtm["IB loss"], ibtm["IB bound"]) == ("0.1234", "0.5678")


def test_nan_and_null_metrics_are_na(make_record):
    recs = [make_record("b", "baseline", top1_pct=None, gmacs=float("nan")),
            make_record("t", "tome", {"r": 4}, top1_pct=70.0, gmacs=2.0)]
    df = comparison_table(recs, *CLS)
    row = by_method(df)["tome (r=4)"]
    assert row["GMACs"] == "2.000" and by_method(df)["baseline"]["GMACs"] == "n/a"
    # no row has a delta, a GMACs cut or an efficiency: those columns are left out (issue 10)
    assert not {"ΔTop-1 (pp)", "GMACs ↓ (%)", "Efficiency"} & set(df.columns)


def test_without_a_successful_baseline_deltas_are_na(records):
    recs = [r for r in records if r["method"] != "baseline"]
    df = comparison_table(recs, *CLS)
    rows = by_method(df)
    assert list(rows) == ["tome (r=13)", "ibtm (r=0.7)"]
    assert rows["tome (r=13)"]["Speed-up (×)"] == "n/a"  # ibtm's comes from its record
    # without a baseline no row has a delta: the columns are left out rather than all n/a
    assert "ΔTop-1 (pp)" not in df.columns and "GMACs ↓ (%)" not in df.columns


def test_no_top5_column_when_no_run_has_it(records):
    recs = [{k: v for k, v in r.items() if k != "top5_pct"} for r in records]
    assert "Top-5 (%)" not in comparison_table(recs, *CLS).columns


def test_detection_uses_box_map(records):
    df = comparison_table(records, *DET)
    assert "Top-1 (%)" not in df.columns and "Mask mAP" not in df.columns
    assert "Throughput (img/s, bs=8)" in df.columns
    rows = by_method(df)
    assert list(rows) == ["baseline", "tome (r=8)"]
    assert rows["tome (r=8)"]["Box mAP"] == "0.290"
    assert rows["tome (r=8)"]["ΔBox mAP"] == "-0.011"
    assert rows["tome (r=8)"]["GMACs ↓ (%)"] == "26.3"


def test_segmentation_adds_mask_map(make_record):
    recs = [make_record("b", "baseline", task="seg", box_map=0.40, mask_map=0.35),
            make_record("t", "tome", {"r": 8}, task="seg", box_map=0.38, mask_map=0.34)]
    row = by_method(comparison_table(recs, "seg", "vitbench-fmnist-vit"))["tome (r=8)"]
    assert (row["Box mAP"], row["ΔBox mAP"]) == ("0.380", "-0.020")
    assert (row["Mask mAP"], row["ΔMask mAP"]) == ("0.340", "-0.010")


def test_groups_do_not_mix(records):
    # the det baseline is not the reference of the cls table, and vice versa
    assert "0.301" not in comparison_table(records, *CLS).to_string()
    assert list(comparison_table(records, "cls", "other-model")["Method"]) == []


def test_mixed_batch_sizes_go_into_the_cells(make_record):
    recs = [make_record("b", "baseline", throughput_img_s=100.0, batch_size=64),
            make_record("t", "tome", {"r": 4}, throughput_img_s=50.0, batch_size=1)]
    df = comparison_table(recs, *CLS)
    assert "Throughput (img/s)" in df.columns
    assert list(df["Throughput (img/s)"]) == ["100.0 (bs=64)", "50.0 (bs=1)"]


def test_method_labels(make_record):
    assert method_label(make_record("a", "tome", {"r": 13})) == "tome (r=13)"
    ppt = make_record("a", "ppt", {"r": 0.5, "adaptive": True, "blocks": [3, 6]})
    assert method_label(ppt) == "ppt (r=0.5, adaptive=true, blocks=3,6)"
    assert method_label(make_record("a", "baseline")) == "baseline"
    # the same method and params on another data set (a store holding both): rows stay apart,
    # each in the group of what it was measured on
    recs = [make_record("b", "baseline"), make_record("t0", "tome", {"r": 4}),
            make_record("t1", "tome", {"r": 4})]
    recs[2]["seed"], recs[2]["data"] = 1, "other-folder"
    df = comparison_table(recs, *CLS)
    assert list(df["Method"]) == ["baseline", "tome (r=4)", "tome (r=4)"]
    assert list(df["Measured on"]) == ["data fashion-mnist"] * 2 + ["data other-folder"]
    # differing only by seed: one row (tests/report/test_report_seeds.py)
    recs[2]["data"] = recs[1]["data"]
    assert list(comparison_table(recs, *CLS)["Method"]) == ["baseline", "tome (r=4)"]


def test_gmacs_keep_three_significant_figures_on_small_models():
    from vitbench.report.tables import gmacs_spec

    assert format(0.03123, gmacs_spec(0.03123)) == "0.0312"
    assert format(4.599, gmacs_spec(4.599)) == "4.599"
    assert format(17.564, gmacs_spec(17.564)) == "17.564"


def test_columns_no_row_measured_are_left_out(make_record):
    # a GMACs-only run: Method, GMACs and the cut, not eight columns of n/a (issue 10)
    recs = [make_record("b", "baseline", gmacs=4.0), make_record("t", "tome", {"r": 4}, gmacs=3.0)]
    for key in ("top1_pct", "top5_pct", "params_m", "throughput_img_s", "latency_ms", "ib_loss", "ib_bound",
                "speedup", "efficiency"):
        for r in recs:
            r.pop(key, None)
    df = comparison_table(recs, *CLS)
    assert list(df.columns) == ["Method", "GMACs", "GMACs ↓ (%)"]
    assert list(df["GMACs ↓ (%)"]) == ["0.0", "25.0"]


def test_a_trained_column_says_what_each_row_trained(records):
    """Column Trained: none, steps on images, shipped weights; absent when no row trained."""
    base = next(r for r in records if r["method"] == "baseline" and r["task"] == "cls")
    fine = {**base, "spec_id": "ft", "method": "ltm", "label": "ibtm (ratio=0.7)", "trained": "fine-tuned",
            "train_images": 60000, "train_stages": [{"name": "finetune", "epochs": 1, "iters": 938}]}
    shipped = {**base, "spec_id": "sh", "method": "ltm", "label": "ibtm (ratio=0.8)", "trained": "shipped",
               "shipped_trained": "trained 1 epoch on 60,000 images"}
    rows = by_method(comparison_table([base, fine, shipped], *CLS))
    assert rows["baseline"]["Trained"] == "none"
    assert rows["ibtm (ratio=0.7)"]["Trained"] == "938 steps on 60,000 images"
    assert rows["ibtm (ratio=0.8)"]["Trained"] == "shipped weights, trained 1 epoch on 60,000 images"
    assert "Trained" not in comparison_table([base], *CLS).columns
