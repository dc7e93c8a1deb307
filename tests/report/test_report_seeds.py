"""Runs that differ only by seed are one report row: accuracy as mean ± sample std with n, deltas
against the baseline's mean, timings as medians over seeds, speed-ups paired per seed."""
from __future__ import annotations

import dataclasses

import pytest

from vitbench.report import comparison_table, render_markdown
from vitbench.report.seeds import aggregate_over_seeds, pair_with_baselines

CLS = ("cls", "vitbench-fmnist-vit")

# per seed 0, 1, 2: top-1, GMACs, throughput (img/s)
BASE = [(80.85, 4.60, 100.0), (81.55, 4.60, 200.0), (81.20, 4.60, 110.0)]
TOME = [(80.50, 2.70, 150.0), (80.70, 2.71, 300.0), (80.90, 2.72, 180.0)]


def seeded(make_record, method, params, values, **extra):
    out = []
    for seed, (top1, gmacs, tp) in enumerate(values):
        rec = make_record(f"{method}-{seed}", method, params, top1_pct=top1, gmacs=gmacs,
                          throughput_img_s=tp, throughput_spread_img_s=1.0, batch_size=32,
                          latency_ms=10.0 + seed, params_m=5.0, **extra)
        rec["seed"] = seed
        out.append(rec)
    return out


@pytest.fixture
def three_seeds(make_record):
    return seeded(make_record, "baseline", None, BASE) + seeded(make_record, "tome", {"r": 4}, TOME)


def by_method(df):
    return {row["Method"]: row for row in df.to_dict("records")}


def test_one_row_per_spec_with_mean_std_and_n(three_seeds):
    df = comparison_table(three_seeds, *CLS)
    assert list(df.columns[:3]) == ["Method", "Seeds", "Params"]
    rows = by_method(df)
    base, tome = rows["baseline"], rows["tome (r=4)"]
    assert base["Seeds"] == tome["Seeds"] == "0,1,2 (n=3)"
    # mean 81.20; sample std sqrt(((-0.35)^2 + 0.35^2 + 0) / 2) = 0.35
    assert base["Top-1 (%)"] == "81.20 ± 0.35"
    assert tome["Top-1 (%)"] == "80.70 ± 0.20"
    assert tome["ΔTop-1 (pp)"] == "-0.50"  # mean minus the baseline's mean
    assert tome["GMACs"] == "2.710"  # the mean
    assert tome["GMACs ↓ (%)"] == "41.1"  # 1 - 2.71 / 4.60
    # throughput and latency: the median over seeds of the per-seed medians
    assert tome["Throughput (img/s, bs=32)"] == "180.0 ± 1.0"
    assert tome["Latency bs=1 (ms)"] == "11.00"


def test_speedup_pairs_each_seed_with_its_own_baseline(three_seeds):
    tome = by_method(comparison_table(three_seeds, *CLS))["tome (r=4)"]
    # per seed 150/100, 300/200, 180/110 = 1.5, 1.5, 1.64 -> median 1.50
    # (unpaired, median 180 / median 110 would say 1.64)
    assert tome["Speed-up (×)"] == "1.50"
    # per seed 1.5 / (4.6/2.70), 1.5 / (4.6/2.71), 1.64 / (4.6/2.72) -> median 0.884
    assert tome["Efficiency"] == "0.88"


def test_recorded_speedups_are_kept_per_seed(make_record, three_seeds):
    three_seeds[3]["speedup"] = 9.0  # what the executor paired: not recomputed
    paired = pair_with_baselines(three_seeds)
    assert paired[3]["speedup"] == 9.0
    assert paired[4]["speedup"] == pytest.approx(1.5)


def test_one_seed_keeps_the_plain_cells(make_record):
    recs = seeded(make_record, "baseline", None, BASE[:1]) + seeded(make_record, "tome", {"r": 4}, TOME[:1])
    df = comparison_table(recs, *CLS)
    assert "Seeds" not in df.columns
    assert by_method(df)["tome (r=4)"]["Top-1 (%)"] == "80.50"
    rows = aggregate_over_seeds(recs)
    assert [r["n_seeds"] for r in rows] == [1, 1]
    assert "top1_pct_seed_std" not in rows[0]


def test_a_failed_seed_leaves_n_smaller_and_is_listed(make_record, three_seeds):
    three_seeds[5] = {**three_seeds[5], "status": "error", "error": "RuntimeError: boom",
                      "top1_pct": None}
    tome = by_method(comparison_table(three_seeds, *CLS))["tome (r=4)"]
    assert tome["Seeds"] == "0,1 (n=2)"
    assert tome["Top-1 (%)"] == "80.60 ± 0.14"
    md = render_markdown(three_seeds)
    assert "- tome (r=4) [seed=2]: RuntimeError: boom" in md


def test_markdown_says_how_seeds_are_summarised(three_seeds):
    md = render_markdown(three_seeds)
    assert "| 0,1,2 (n=3) |" in md and "81.20 ± 0.35" in md
    assert "mean ± sample standard deviation over those seeds" in md
    assert "against the baseline of the same seed" in md
    assert "[seed=" not in md


def test_plot_draws_one_point_per_row_with_seed_error_bars(three_seeds, tmp_path, monkeypatch):
    import vitbench.report.plot as plot

    bars = []
    real = plot.Axes.errorbar

    def spy(self, x, y, **kw):
        bars.append((x, y, kw.get("yerr")))
        return real(self, x, y, **kw)

    monkeypatch.setattr(plot.Axes, "errorbar", spy)
    plot.plot_accuracy_vs_gmacs(three_seeds, tmp_path / "p.png")
    gmacs_panel = bars[:2]
    assert [(round(x, 3), round(y, 2), round(e, 2)) for x, y, e in gmacs_panel] == [
        (4.6, 81.2, 0.35), (2.71, 80.7, 0.2)]


def test_runs_trained_on_different_images_are_two_rows_not_two_seeds(make_record):
    """``--train-limit 10000`` and ``60000`` of one method and seed: two rows, each its own top-1,
    labelled by its training images."""
    base = seeded(make_record, "baseline", None, BASE[:1])
    runs = []
    for images, top1 in ((10000, 89.25), (60000, 89.50)):
        (rec,) = seeded(make_record, "cropr", {"rate": 8}, [(top1, 0.257, 150.0)])
        rec.update(spec_id=f"cropr-{images}", train_images=images,
                   train_stages=[{"name": "finetune", "epochs": 1, "images": images, "last_loss": top1 / 10}])
        runs.append(rec)
    rows = by_method(comparison_table(base + runs, *CLS))
    assert rows["cropr (rate=8) [trained on 10,000 images]"]["Top-1 (%)"].startswith("89.25")
    assert rows["cropr (rate=8) [trained on 60,000 images]"]["Top-1 (%)"].startswith("89.50")
    assert len(aggregate_over_seeds(base + runs)) == 3


def test_the_spread_is_over_the_tasks_own_accuracy_columns() -> None:
    from vitbench.report.seeds import spread_keys

    assert spread_keys("cls") == ("top1_pct", "top5_pct", "agreement_pct", "ib_loss", "ib_bound")
    assert spread_keys("seg")[:6] == ("box_map", "box_ap50", "box_ap75", "mask_map", "mask_ap50", "mask_ap75")


def test_a_task_of_its_own_gets_its_column_aggregated(make_record, monkeypatch) -> None:
    from vitbench.host import get_host
    from vitbench.task import ReportColumn

    task = get_host().task("cls")
    column = (ReportColumn("agreement_pct", "Agreement (%)", "ΔAgreement (pp)", ".1f"),)
    recs = [{**make_record(f"a-{s}", "tome", {"r": 4}, agreement_pct=v), "seed": s, "task": "cls"}
            for s, v in enumerate((70.0, 72.0, 74.0))]
    monkeypatch.setattr(type(task), "info", dataclasses.replace(task.info, accuracy=column))
    row = aggregate_over_seeds(recs)[0]
    assert row["agreement_pct"] == pytest.approx(72.0) and row["agreement_pct_seed_std"] == pytest.approx(2.0)
