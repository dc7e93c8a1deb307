"""Matched compute (issue 10): the knob search on synthetic counts, the budget checks, and every
built-in's knob calibrated on a tiny random ViT to within the tolerance of F x the baseline."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch

import vitbench
from vitbench import measure
from vitbench.measure.calibrate import (
    TOLERANCE, GmacsCounter, calibrate, check_fraction, prepared_as_trained, search_knob,
)
from vitbench.catalog import BudgetKnob, MethodSpec, Reduction
from vitbench.core.option_values import checked_budgets
from vitbench.errors import BudgetError, ParamError
from vitbench.host import get_host
from vitbench.testing.conformance import tiny_vit


# -- the search on synthetic monotone counts ---------------------------------------------------

def _tokens_removed(r):  # GMACs of a 12-block model that loses r tokens per block (list: per block)
    per_block = [r] * 12 if isinstance(r, int) else r
    tokens, total = 65.0, 0.0
    for rb in per_block:
        total += tokens
        tokens = max(tokens - rb, 1.0)
    return total


def test_integer_knob_lands_on_the_nearest_integer_within_tolerance():
    knob = BudgetKnob("r", larger_means="less", low=0, high=100, integer=True)
    seen = []
    count = lambda r: seen.append(r) or 1000.0 - 7.0 * r  # noqa: E731 - fewer GMACs as r grows
    value, g, n = search_knob(count, knob, 0, 100, 600.0, method="m")
    assert (value, g) == (57, 601.0)  # 57.14 is the exact solution; 57 is nearest
    assert n == len(seen) == len(set(seen)) <= 4  # the ends, 57 and 58: each setting counted once
    curved = lambda r: _tokens_removed(r) * 10  # noqa: E731 - tokens shrinking block by block: not linear in r
    target = curved(9) * 1.004
    value, g, n = search_knob(curved, knob, 0, 64, target, method="m")
    assert value == 9 and n < 8  # bisection over 0..64 counted 8


def test_per_block_knob_lands_between_integers_when_no_integer_does():
    knob = BudgetKnob("r", larger_means="less", low=0, high=64, integer=True, per_block=True)
    # right between r=4 and r=5, where both are ~5 % off
    target = (_tokens_removed(4) + _tokens_removed(5)) / 2
    assert abs(_tokens_removed(4) / target - 1) > TOLERANCE and abs(_tokens_removed(5) / target - 1) > TOLERANCE
    value, g, _ = search_knob(_tokens_removed, knob, 0, 64, target, method="m", depth=12)
    assert isinstance(value, list) and len(value) == 12 and set(value) == {4, 5}
    assert value == sorted(value)  # the last blocks take the extra token
    assert abs(g / target - 1) <= TOLERANCE
    plain = BudgetKnob("r", larger_means="less", low=0, high=64, integer=True)
    with pytest.raises(BudgetError, match=r"cannot land within 2 % .*r=4 gives .*r=5 gives"):
        search_knob(_tokens_removed, plain, 0, 64, target, method="m")


def test_float_knob_lands_well_within_tolerance_in_few_counts():
    knob = BudgetKnob("keep", larger_means="more", low=0.001, high=1.0)
    count = lambda keep: 1.0 + 9.0 * math.ceil(keep * 64) / 64  # noqa: E731 - fixed cost + tokens kept
    value, g, _ = search_knob(count, knob, 0.001, 1.0, 5.0, method="m")
    # tokens come in steps of 9/64 GMACs: the closest step, within the tolerance
    assert g == min((count(k / 64) for k in range(65)), key=lambda v: abs(v - 5.0))
    assert abs(g / 5.0 - 1) <= TOLERANCE and 0 < value < 1
    assert value == round(value, 4)  # readable labels
    smooth, _, n = search_knob(lambda keep: 10 * keep, knob, 0.001, 1.0, 5.0, method="m")
    assert abs(10 * smooth / 5.0 - 1) <= TOLERANCE / 4  # a smooth count: aims at a quarter of it
    assert n <= 4  # the two ends, the false-position guess and its rounding (bisection took 10)


def test_a_budget_below_the_floor_is_a_clear_error_naming_the_reachable_range():
    knob = BudgetKnob("r", larger_means="less", low=0, high=64, integer=True)
    base = _tokens_removed(0)
    floor = _tokens_removed(64)
    with pytest.raises(BudgetError) as err:
        search_knob(_tokens_removed, knob, 0, 64, 0.5 * floor, method="tome", baseline=base)
    msg = str(err.value)
    assert msg.startswith("tome cannot reach F = ") and "fewest GMACs" in msg and "r=64" in msg
    assert f"valid budgets for tome here: F >= {floor / (1 + TOLERANCE) / base:.3f}" in msg


def test_a_budget_above_the_ceiling_is_a_clear_error():
    knob = BudgetKnob("keep", larger_means="more", low=0.1, high=0.5)
    with pytest.raises(BudgetError, match=r"most GMACs .*keep=0\.5.*F <= "):
        search_knob(lambda k: k, knob, 0.1, 0.5, 1.0, method="m", baseline=1.0)


@pytest.mark.parametrize("bad", [0, "0", -0.5, 1.5, "1.01", "abc", "nan", "inf", None, True])
def test_malformed_budgets_name_the_value_and_the_range(bad):
    with pytest.raises(ParamError) as err:
        check_fraction(bad)
    assert repr(bad) in str(err.value) and ("(0, 1]" in str(err.value))


@pytest.mark.parametrize("text, message", [
    ("", "--budgets '' is empty"),
    ("0.9,0,0.5", "--budgets item '0' is out of range; the fraction of the baseline's GMACs to keep must be in (0, 1]"),
    ("0.9,x", "--budgets item 'x' is not a number"),
    ("0.9,0.9", "--budgets names 0.9 twice"),
])
def test_malformed_budget_lists(text, message):
    with pytest.raises(ParamError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]").replace(".", r"\.")):
        checked_budgets(text)


def test_budget_lists_parse():
    assert checked_budgets("0.9, 0.7,0.5,1") == (0.9, 0.7, 0.5, 1.0)


def test_counter_counts_each_setting_once():
    tome = get_host().method("tome").params
    calls = []
    counter = GmacsCounter(lambda method, values: calls.append((method, values)) or 1.0)
    for _ in range(3):
        counter("tome", tome(r=3))
        counter("tome", tome(r=3, prop_attn=True))  # the same setting: the default given
        counter(None, None)
    assert calls == [("tome", tome(r=3)), (None, None)] and counter.counted == 2


# -- every built-in on a tiny random ViT -----------------------------------------------------------

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tiny():
    return tiny_vit()


def _counter(model):
    def count(method, values):
        m = copy.deepcopy(model)
        if method is not None:
            m = prepared_as_trained(vitbench.apply(m, method, values), IMAGES)
        return measure.count_gmacs(m.eval(), IMAGES).mean

    return GmacsCounter(count)


@pytest.mark.parametrize("method", ["tome", "ppt", "entropy", "average", "topk", "ltm", "random", "random-drop"])
@pytest.mark.parametrize("fraction", [0.8, 0.6])
def test_searched_knobs_land_within_tolerance_on_a_tiny_vit(tiny, method, fraction):
    host = get_host()
    if method not in host.names("methods"):
        pytest.skip(f"{method} is not installed")
    spec = host.method(method)
    assert spec.budget is not None and spec.budget.mode == "search"
    counter = _counter(tiny)
    info = host.family_of(tiny).describe(tiny)
    result = calibrate(spec, None, fraction, counter, info)
    assert result.param == spec.budget.param and result.params[result.param] == result.value
    assert abs(result.calibrated_gmacs / (fraction * result.baseline_gmacs) - 1) <= TOLERANCE
    # the count of a fresh model reduced with the chosen value is the one the search saw
    model = prepared_as_trained(vitbench.apply(copy.deepcopy(tiny), method, **result.params), IMAGES)
    assert measure.count_gmacs(model.eval(), IMAGES).mean == pytest.approx(result.calibrated_gmacs)
    assert result.record()["calibrated_off_pct"] == pytest.approx(100 * (result.calibrated_gmacs / result.target_gmacs - 1))


@pytest.mark.parametrize("method, param", [("dcs", "budget"), ("ltmp", "gmacs_fraction")])
def test_learnable_budget_parameters_are_set_to_the_fraction(tiny, method, param):
    spec = get_host().method(method)
    counter = _counter(tiny)
    result = calibrate(spec, None, 0.6, counter, get_host().family_of(tiny).describe(tiny))
    assert (result.param, result.value, result.mode) == (param, 0.6, "fraction")
    assert result.params[param] == 0.6 and result.values == get_host().method(method).params(**{param: 0.6})
    assert result.calibrated_gmacs is None
    assert counter.counted == 1  # only the baseline: the count is checked after fine-tuning


def test_tome_below_its_floor_is_unreachable(tiny):
    spec = get_host().method("tome")
    with pytest.raises(BudgetError, match=r"tome cannot reach F = 0\.05 .*fewest GMACs .*valid budgets for tome here: F >= "):
        calibrate(spec, None, 0.05, _counter(tiny), get_host().family_of(tiny).describe(tiny))


def test_a_method_without_a_knob_is_not_matchable(tiny):
    @dataclass(frozen=True)
    class NoParams:
        pass

    spec = MethodSpec("knobless", NoParams, lambda p, info: Reduction([None] * info.depth))
    counter = _counter(tiny)
    with pytest.raises(BudgetError, match="knobless is not matchable: its plugin declares no budget knob"):
        calibrate(spec, None, 0.6, counter, get_host().family_of(tiny).describe(tiny))
    assert counter.counted == 0


def test_a_coarse_knob_below_takes_the_nearest_setting_under_the_budget():
    """``coarse="below"`` (whole-patch images): no setting lands within 2 %, so the search takes the
    nearest one under the target instead of failing; ``"fail"`` still fails."""
    steps = lambda keep: 100.0 * (0.5 if keep < 0.5 else 0.7 if keep < 0.8 else 1.0)  # noqa: E731
    below = BudgetKnob("keep", larger_means="more", coarse="below")
    value, g, _ = search_knob(steps, below, 0.001, 1.0, 60.0, method="m")
    assert g == 50.0 and value < 0.5
    with pytest.raises(BudgetError, match="steps too coarse"):
        search_knob(steps, BudgetKnob("keep", larger_means="more"), 0.001, 1.0, 60.0, method="m")
    with pytest.raises(ValueError, match="coarse='up'"):
        BudgetKnob("keep", larger_means="more", coarse="up")


def test_knob_declarations_are_checked():
    with pytest.raises(ValueError, match="larger_means='up'"):
        BudgetKnob("r", larger_means="up")
    with pytest.raises(ValueError, match="mode='guess'"):
        BudgetKnob("r", larger_means="less", mode="guess")
    spec = MethodSpec("m", dict, lambda p, i: None, budget={"param": "keep", "larger_means": "more"})
    assert spec.budget == BudgetKnob("keep", larger_means="more")
    with pytest.raises(TypeError, match="takes a BudgetKnob"):
        MethodSpec("m", dict, lambda p, i: None, budget="keep")


def test_a_learnable_method_is_counted_as_zero_epochs_of_fine_tuning_leave_it(tiny):
    # LTM's statistics pass (its stage's `before`) sizes the class statistics its IB step runs
    # against in every later block: with the step at inference (ib_step=always) the trained model
    # pays for them, so the search counts them; with the step in training only they cost nothing
    for ib_step, grows in (("always", True), ("train", False)):
        bare = vitbench.apply(copy.deepcopy(tiny), "ltm", ratio=0.7, ib_step=ib_step)
        before = measure.count_gmacs(bare.eval(), IMAGES).mean
        prepared = prepared_as_trained(bare, IMAGES)
        after = measure.count_gmacs(prepared.eval(), IMAGES).mean
        assert prepared is bare and (after > before if grows else after == before)
    tome = vitbench.apply(copy.deepcopy(tiny), "tome", r=4)  # no training stages: left as it is
    assert prepared_as_trained(tome, IMAGES) is tome
