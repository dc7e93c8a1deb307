"""Rows are compared only with a baseline measured on the same images, head and weights
(vitbench/report/measured_on.py); old records, without ``measured_on``, group by their fields."""
from __future__ import annotations

from vitbench.report import render_markdown
from vitbench.report.measured_on import derive_measured_on, describe, in_group, measured_on, on_key
from vitbench.report.seeds import aggregate_over_seeds
from vitbench.report.sweep import render_sweep_markdown
from vitbench.report.tables import comparison_table, measured_groups, ok_rows

CLS = ("cls", "vitbench-fmnist-vit")
HEAD = {"num_classes": 2, "method": "linear probe", "train_images": 12, "train_top1_pct": 90.0, "data": "folder",
        "checkpoint_path": "out/checkpoints/head-a.pth"}


def _on(rec, **on):
    rec["measured_on"] = {"data": rec["data"], **on}
    return rec


def test_an_old_record_derives_what_it_was_measured_on(make_record):
    old = make_record("b", "baseline", top1_pct=80.0, num_images=16)
    assert "measured_on" not in old
    assert measured_on(old) == {"data": "fashion-mnist", "images": 16}
    old["head"] = HEAD
    assert measured_on(old) == {"data": "fashion-mnist", "images": 16, "head": "2-way, fitted on 12 training images"}
    # a new record of the same run carries the same key, so an old store's baseline still serves it
    new = dict(old, measured_on=derive_measured_on(old))
    assert on_key(new) == on_key(old)
    assert derive_measured_on({"data": "d"}, limit=4, weights="init_seed=1") == {
        "data": "d", "images": 4, "weights": "init_seed=1"}
    assert describe(on_key(new)) == "16 evaluation images of fashion-mnist; head: 2-way, fitted on 12 training images"
    assert describe('{"weights": "sha256=' + "ab" * 32 + '"}') == (
        "random inputs (no data); weights: checkpoint sha256 abababababab")


def test_an_old_store_loads_and_reports_as_before(make_record):
    recs = [make_record("b", "baseline", top1_pct=80.0, num_images=16, gmacs=4.0),
            make_record("t", "tome", {"r": 4}, top1_pct=78.5, num_images=16, gmacs=2.0)]
    assert measured_groups(recs, *CLS) == [on_key(recs[0])]
    df = comparison_table(recs, *CLS)
    assert "Measured on" not in df.columns
    assert list(df["ΔTop-1 (pp)"]) == ["0.00", "-1.50"]
    md = render_markdown(recs)
    assert "| tome (r=4)" in md and "-1.50" in md and "Measured on" not in md


def test_no_delta_across_different_evaluation_images(make_record):
    """tome at --limit 4, later topk at --limit 16 in one folder (two baselines, two groups)."""
    recs = [_on(make_record("b4", "baseline", top1_pct=100.0, num_images=4), images=4),
            _on(make_record("t4", "tome", {"r": 4}, top1_pct=75.0, num_images=4), images=4),
            _on(make_record("b16", "baseline", top1_pct=81.25, num_images=16), images=16),
            _on(make_record("k16", "topk", {"keep": 0.5}, top1_pct=50.0, num_images=16), images=16)]
    df = comparison_table(recs, *CLS)
    assert list(df["Method"]) == ["baseline", "tome (r=4)", "baseline", "topk (keep=0.5)"]
    assert list(df["ΔTop-1 (pp)"]) == ["0.00", "-25.00", "0.00", "-31.25"]
    assert list(df["Measured on"]) == ["4 evaluation images of fashion-mnist"] * 2 + [
        "16 evaluation images of fashion-mnist"] * 2
    md = render_markdown(recs)
    assert "measured on 2 different sets of evaluation images" in md
    four, sixteen = md.split("### Measured on 4 evaluation images")[1].split("### Measured on 16 evaluation images")
    assert "tome (r=4)" in four and "-25.00" in four and "topk" not in four
    assert "topk (keep=0.5)" in sixteen and "-31.25" in sixteen and "tome" not in sixteen.split("## Plot")[0]
    assert "-43.75" not in md and "-6.25" not in md  # no delta against the other group's baseline


def test_a_row_without_a_baseline_of_its_own_group_shows_no_delta(make_record):
    recs = [_on(make_record("b16", "baseline", top1_pct=81.25, num_images=16), images=16),
            _on(make_record("t4", "tome", {"r": 4}, top1_pct=75.0, num_images=4), images=4)]
    df = comparison_table(recs, *CLS)
    assert list(df["ΔTop-1 (pp)"]) == ["0.00", "n/a"]
    md = render_markdown(recs)
    assert md.count("No successful baseline was measured on these images, head and weights, so this table shows "
                    "no deltas") == 1


def test_different_weights_are_different_groups_and_seeds_do_not_mix(make_record):
    """A seed-1 run of a ``--seeds 0,1`` plan (weights drawn from seed 0) and of a ``--seed 1``
    plan (from seed 1) share a seed but not weights: different rows, each with its own baseline."""
    def rec(spec_id, method, seed, init, top1):
        r = _on(make_record(spec_id, method, {"r": 4} if method == "tome" else None, top1_pct=top1,
                            num_images=8), images=8, weights=f"init_seed={init}")
        r["seed"] = seed
        return r

    recs = [rec("b0", "baseline", 0, 0, 10.0), rec("t0", "tome", 0, 0, 8.0), rec("b1", "baseline", 1, 0, 12.0),
            rec("t1", "tome", 1, 0, 9.0), rec("B1", "baseline", 1, 1, 50.0), rec("T1", "tome", 1, 1, 40.0)]
    rows = aggregate_over_seeds(recs)
    assert [(r["method"], r["seeds"]) for r in rows] == [("baseline", [0, 1]), ("tome", [0, 1]), ("baseline", [1]),
                                                         ("tome", [1])]
    first, base = ok_rows(recs, *CLS, on=on_key(recs[4]))
    assert base["spec_id"] == "B1" and [r["spec_id"] for r in first] == ["B1", "T1"]
    df = comparison_table(recs, *CLS)
    assert list(df["ΔTop-1 (pp)"]) == ["0.00", "-2.50", "0.00", "-10.00"]
    assert "weights: random init (seed 1)" in render_markdown(recs)


def test_the_head_sentence_is_written_only_where_true(make_record):
    def rec(spec_id, method, head):
        r = make_record(spec_id, method, {"r": 4} if method == "tome" else None, top1_pct=60.0, num_images=6)
        r["head"] = head
        return r

    other = dict(HEAD, train_images=4, checkpoint_path="out/checkpoints/head-b.pth")
    # --train-limit 12, then --train-limit 4 --resume with a new method: the old store's runs keep
    # the old head, the new one has its own group (and no baseline of its own here)
    recs = [rec("b", "baseline", HEAD), rec("t", "tome", HEAD), rec("k", "topk", other)]
    md = render_markdown(recs)
    assert md.count("the baseline and every method start from it") == 1
    assert "every row of this table starts from it, and no baseline was measured with it" in md
    assert "### Measured on 6 evaluation images of fashion-mnist; head: 2-way, fitted on 4 training images" in md
    single = render_markdown(recs[:2])
    assert "the baseline and every method start from it" in single and "Measured on" not in single


def test_a_failed_run_goes_with_its_group_though_it_counted_no_images(make_record):
    ok = _on(make_record("b", "baseline", top1_pct=60.0, num_images=6), images=6, weights="init_seed=0")
    failed = _on(make_record("t", "tome", {"r": 4}, status="error", error="boom"), weights="init_seed=0")
    assert in_group(failed, on_key(ok)) and in_group(ok, on_key(ok))
    assert not in_group(_on(dict(failed), weights="init_seed=1"), on_key(ok))


def test_a_sweep_compares_within_each_group(make_record):
    def rec(spec_id, method, images, top1, budget=None, gmacs=4.0):
        r = _on(make_record(spec_id, method, {"r": 4} if method == "tome" else None, top1_pct=top1,
                            num_images=images, gmacs=gmacs), images=images)
        if budget is not None:
            r["match_gmacs"] = budget
        return r

    recs = [rec("b4", "baseline", 4, 100.0), rec("t4", "tome", 4, 75.0, 0.5, 2.0),
            rec("b16", "baseline", 16, 80.0), rec("t16", "tome", 16, 60.0, 0.5, 2.0)]
    md = render_sweep_markdown(recs)
    assert "each with its own summary and tables" in md
    four, sixteen = md.split("### Measured on 4 evaluation images")[1].split("### Measured on 16 evaluation images")
    assert "#### Summary" in four and "-25.00" in four and "-20.00" not in four
    assert "-20.00" in sixteen and "-25.00" not in sixteen


def test_each_group_is_its_own_row_of_plots(make_record, tmp_path):
    from vitbench.report.plot import plot_accuracy_vs_gmacs
    from vitbench.report.tables import panels

    recs = [_on(make_record("b4", "baseline", top1_pct=100.0, num_images=4, gmacs=4.0), images=4),
            _on(make_record("b16", "baseline", top1_pct=80.0, num_images=16, gmacs=4.0), images=16)]
    assert [(on is not None, note) for *_, on, note in panels(recs)] == [
        (True, "\nmeasured on 4 evaluation images of fashion-mnist"),
        (True, "\nmeasured on 16 evaluation images of fashion-mnist")]
    assert [note for *_, note in panels(recs[:1])] == [""]
    assert plot_accuracy_vs_gmacs(recs, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
