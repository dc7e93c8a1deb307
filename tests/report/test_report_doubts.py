"""Timings not to be trusted are marked † and explained under the table (issue 9, item 6)."""
from __future__ import annotations

from vitbench.measure.speed import LOAD_MARGIN, SPREAD_LIMIT, timing_doubt
from vitbench.report import comparison_table, render_markdown
from vitbench.report.doubts import timing_reason

CLS = ("cls", "vitbench-fmnist-vit")
TP = "Throughput (img/s, bs=32)"


def by_method(df):
    return {row["Method"]: row for row in df.to_dict("records")}


def timing(prefix, median, spread, load_before=0.5, load_after=0.7, cores=2, threads=2):
    reason = timing_doubt(median, spread, load_before, load_after, cores)
    return {f"{prefix}_load_before": load_before, f"{prefix}_load_after": load_after,
            f"{prefix}_cores": cores, f"{prefix}_threads": threads,
            f"{prefix}_spread_ratio": spread / median, f"{prefix}_flagged": reason is not None,
            f"{prefix}_flag_reason": reason}


def rec(make_record, spec_id, method, params=None, *, tp=(100.0, 2.0), lat=(10.0, 0.2), seed=0, **kw):
    r = make_record(spec_id, method, params, gmacs=4.6 if method == "baseline" else 2.3, batch_size=32,
                    throughput_img_s=tp[0], throughput_spread_img_s=tp[1], latency_ms=lat[0],
                    latency_spread_ms=lat[1], **timing("throughput", *tp, **kw.pop("tp_load", {})),
                    **timing("latency", *lat, **kw.pop("lat_load", {})), **kw)
    r["seed"] = seed
    return r


def test_timing_doubt_rules():
    assert SPREAD_LIMIT == 0.10 and LOAD_MARGIN == 0.5
    assert timing_doubt(100.0, 10.0, 0.5, 0.5, 2) is None  # exactly at the limit: trusted
    assert timing_doubt(100.0, 23.4, 0.5, 0.5, 2) == "spread 23.4 % of the median (limit 10 %)"
    assert timing_doubt(100.0, 1.0, 2.4, 2.5, 2) is None  # our own 2 threads on 2 cores
    assert timing_doubt(100.0, 1.0, 1.0, 3.1, 2) == "load average 1.00/3.10 before/after above 2 cores + 0.5"
    both = timing_doubt(7.0, 9.0, 5.0, None, 2)
    assert both.startswith("spread 128.6 %") and "load average 5.00/n/a" in both
    assert timing_doubt(100.0, 1.0, None, None, None) is None  # unknown load is not held against it
    assert timing_doubt(None, None, 9.0, 9.0, 2) is not None  # load alone


def test_trusted_timings_are_not_marked(make_record):
    recs = [rec(make_record, "b", "baseline"), rec(make_record, "t", "tome", {"r": 4}, tp=(150.0, 3.0))]
    rows = by_method(comparison_table(recs, *CLS))
    assert rows["tome (r=4)"][TP] == "150.0 ± 3.0"
    assert rows["tome (r=4)"]["Speed-up (×)"] == "1.50"
    assert "†" not in render_markdown(recs)


def test_wide_spread_marks_the_cell_and_the_derived_speedup(make_record):
    recs = [rec(make_record, "b", "baseline"), rec(make_record, "t", "tome", {"r": 4}, tp=(150.0, 30.0))]
    tome = by_method(comparison_table(recs, *CLS))["tome (r=4)"]
    assert tome[TP] == "150.0 ± 30.0 †"
    assert (tome["Speed-up (×)"], tome["Efficiency"]) == ("1.50 †", "0.75 †")
    assert tome["Latency bs=1 (ms)"] == "10.00"  # the latency was fine
    md = render_markdown(recs)
    assert "† Timing not to be trusted" in md
    assert ("- tome (r=4), throughput: spread 20.0 % of the median (limit 10 %) (1-min load average "
            "0.50 before, 0.70 after, 2 cores, 2 threads)") in md
    assert "- tome (r=4), speed-up and efficiency: derived from this row's marked throughput" in md


def test_busy_machine_marks_the_baseline_and_every_speedup_taken_against_it(make_record):
    recs = [rec(make_record, "b", "baseline", tp_load={"load_before": 3.9, "load_after": 4.2},
                lat_load={"load_before": 4.2, "load_after": 4.4}),
            rec(make_record, "t", "tome", {"r": 4}, tp=(150.0, 3.0))]
    rows = by_method(comparison_table(recs, *CLS))
    base, tome = rows["baseline"], rows["tome (r=4)"]
    assert base[TP] == "100.0 ± 2.0 †" and base["Latency bs=1 (ms)"] == "10.00 †"
    assert base["Speed-up (×)"] == "1.00"  # 1 by definition
    assert tome[TP] == "150.0 ± 3.0"
    assert tome["Speed-up (×)"] == "1.50 †"
    md = render_markdown(recs)
    assert ("- baseline, latency: load average 4.20/4.40 before/after above 2 cores + 0.5 (1-min load "
            "average 4.20 before, 4.40 after, 2 cores, 2 threads)") in md
    assert "- tome (r=4), speed-up and efficiency: derived from the baseline's marked throughput" in md


def test_a_record_without_load_facts_is_judged_by_its_spread(make_record):
    old = make_record("t", "tome", {"r": 4}, throughput_img_s=100.0, throughput_spread_img_s=30.0,
                      latency_ms=10.0, latency_spread_ms=0.5)
    assert timing_reason(old, "throughput") == "spread 30.0 % of the median (limit 10 %)"
    assert timing_reason(old, "latency") is None
    # the record's own verdict wins over a recomputation
    judged = {**old, "throughput_flagged": False, "throughput_flag_reason": None}
    assert timing_reason(judged, "throughput") is None


def test_one_disturbed_seed_marks_the_row_and_names_the_seed(make_record):
    recs = [rec(make_record, "b0", "baseline"), rec(make_record, "t0", "tome", {"r": 4}, tp=(150.0, 3.0)),
            rec(make_record, "b1", "baseline", seed=1),
            rec(make_record, "t1", "tome", {"r": 4}, tp=(150.0, 3.0), seed=1,
                lat_load={"load_before": 6.0, "load_after": 6.5})]
    tome = by_method(comparison_table(recs, *CLS))["tome (r=4)"]
    assert tome["Latency bs=1 (ms)"] == "10.00 †"
    assert tome[TP] == "150.0 ± 3.0" and tome["Speed-up (×)"] == "1.50"
    assert "- tome (r=4), latency: seed 1: load average 6.00/6.50" in render_markdown(recs)


def test_a_drifting_control_marks_every_speed_up():
    """det/seg: the control is the baseline's own model, so a speed-up of it far from 1 means the
    machine drifted between measurements; every speed-up in the table is then marked."""
    from vitbench.report.doubts import drift_reason, row_doubts
    from vitbench.report.tables import comparison_table

    def rec(method, tp, **extra):
        return {"spec_id": method, "task": "det", "model": "efficientvit_b1", "method": method, "params": {},
                "seed": 0, "status": "ok", "box_map": 0.5, "gmacs": 1.0, "throughput_img_s": tp,
                "throughput_flagged": False, "batch_size": 32, **extra}

    tuned = {"trained": "fine-tuned", "dense_finetune": {"protocol": "all"}}
    base, control, dcs = rec("baseline", 16.8), rec("baseline+ft", 26.8, **tuned), rec("dcs", 23.0, **tuned)
    why = drift_reason(control, base)
    assert why is not None and "ran at 1.60x the baseline's throughput" in why
    assert drift_reason(rec("baseline+ft", 17.5), base) is None  # within 10 %: no drift
    assert row_doubts(dcs, base, control).derived == [why] and not row_doubts(base, base, control)
    df = comparison_table([base, control, dcs], "det", "efficientvit_b1").set_index("Method")
    assert df.loc["dcs", "Speed-up (×)"].endswith("†") and df.loc["baseline+ft", "Speed-up (×)"].endswith("†")
    assert not df.loc["baseline", "Speed-up (×)"].endswith("†")


def paired(speedup, spread, **load):
    return {"speedup": speedup, "speedup_spread": spread, "speedup_rounds": 10, "speedup_paired": True,
            **timing("speedup", speedup, spread, **load)}


def test_a_paired_speedup_is_judged_by_its_own_rounds_not_the_throughputs(make_record):
    busy = {"load_before": 3.9, "load_after": 4.2}
    recs = [rec(make_record, "b", "baseline", tp_load=busy),
            rec(make_record, "t", "tome", {"r": 4}, tp=(150.0, 30.0), **paired(1.2, 0.02))]
    tome = by_method(comparison_table(recs, *CLS))["tome (r=4)"]
    assert tome[TP] == "150.0 ± 30.0 †"  # its own throughput is still doubted
    assert (tome["Speed-up (×)"], tome["Efficiency"]) == ("1.20", "0.60")  # the paired value, unmarked
    assert "speed-up and efficiency" not in render_markdown(recs)


def test_paired_rounds_that_disagree_mark_the_speedup(make_record):
    recs = [rec(make_record, "b", "baseline"), rec(make_record, "t", "tome", {"r": 4}, **paired(1.2, 0.3))]
    tome = by_method(comparison_table(recs, *CLS))["tome (r=4)"]
    assert tome["Speed-up (×)"] == "1.20 †"
    assert ("- tome (r=4), speed-up and efficiency: timed in turn with the baseline: spread 25.0 % of the "
            "median (limit 10 %)") in render_markdown(recs)


def test_a_speedup_beyond_what_its_gmacs_allow_is_marked(make_record):
    # tome at half the baseline's GMACs (2.3 of 4.6) can be at most 2x as fast, up to its spread
    paired = {"speedup_paired": True, "speedup_spread": 0.5, **timing("speedup", 1.0, 0.01)}
    recs = [rec(make_record, "b", "baseline"), rec(make_record, "t", "tome", {"r": 4}, speedup=2.4, **paired),
            rec(make_record, "k", "topk", {"keep": 0.5}, speedup=2.6, **paired)]
    rows = by_method(comparison_table(recs, *CLS))
    assert rows["tome (r=4)"]["Speed-up (×)"] == "2.40"  # 2.4 - 0.5 is within 2x: noise, not an error
    assert rows["topk (keep=0.5)"]["Speed-up (×)"] == "2.60 †"
    assert ("- topk (keep=0.5), speed-up and efficiency: its speed-up 2.60x (spread 0.50) exceeds the 2.00x "
            "its GMACs allow (baseline GMACs / its GMACs): a measurement error, not the method's") in render_markdown(recs)


def test_an_end_to_end_speed_started_on_a_busy_machine_is_marked(make_record):
    recs = [rec(make_record, "b", "baseline", eval_img_s=190.0, eval_batch_size=128, eval_load_before=0.4,
                eval_cores=2, eval_flag_reason=None),
            rec(make_record, "t", "tome", {"r": 4}, eval_img_s=240.0, eval_batch_size=128, eval_load_before=4.2,
                eval_cores=2, eval_flag_reason=timing_doubt(None, None, 4.2, None, 2))]
    rows = by_method(comparison_table(recs, *CLS))
    col = "End to end (img/s, bs=128)"
    assert (rows["baseline"][col], rows["tome (r=4)"][col]) == ("190.0", "240.0 †")
    assert ("- tome (r=4), end to end: load average 4.20/n/a before/after above 2 cores + 0.5"
            in render_markdown(recs))
