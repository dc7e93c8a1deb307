"""A sweep's curves: one per method and setting of its other parameters, keyed by matched budget."""
from __future__ import annotations

from vitbench.report.curves import accuracy_keys, curve_key, curves, gmacs_key, record_budget


def _at(make_record, sid, method, params, budget, knob, **metrics):
    return make_record(sid, method, params, match_gmacs=budget, budget={"param": knob}, **metrics)


def test_a_record_budget_is_its_matched_fraction(make_record):
    assert record_budget(make_record("b", "baseline", gmacs=10.0)) is None
    assert record_budget(_at(make_record, "t", "tome", {"r": 3}, 0.9, "r")) == 0.9


def test_the_curve_key_leaves_out_the_matched_knob(make_record):
    rec = _at(make_record, "t", "tome", {"r": 3, "prop_attn": True}, 0.9, "r")
    assert curve_key(rec) == ("tome", '{"prop_attn": true}')


def test_two_settings_of_a_method_are_two_named_curves_and_the_baseline_none(make_record):
    recs = [make_record("b", "baseline", gmacs=10.0),
            _at(make_record, "a9", "tome", {"r": 3, "prop_attn": True}, 0.9, "r", gmacs=9.0),
            _at(make_record, "a7", "tome", {"r": 7, "prop_attn": True}, 0.7, "r", gmacs=7.0),
            _at(make_record, "b9", "tome", {"r": 4, "prop_attn": False}, 0.9, "r", gmacs=9.0)]
    cs = curves(recs, "cls", "vitbench-fmnist-vit")
    assert [c.name for c in cs] == ['tome (prop_attn=True)', 'tome (prop_attn=False)']
    assert sorted(cs[0].rows) == [0.7, 0.9] and list(cs[1].rows) == [0.9]


def test_what_a_sweep_compares_on_each_task():
    assert accuracy_keys("cls") == ("top1_pct",)
    assert gmacs_key("cls") == "gmacs"


def test_a_seed_stored_twice_is_listed_once_and_counted() -> None:
    from vitbench.report.tables import seeds_cell

    assert seeds_cell([0, 1, 2]) == "0,1,2 (n=3)"
    assert seeds_cell([0, 1, 2, 0, 1, 2]) == "0,1,2 (n=6, 2 runs of each)"
    assert seeds_cell([0, 0, 1]) == "0,1 (n=3, some seeds run more than once)"
