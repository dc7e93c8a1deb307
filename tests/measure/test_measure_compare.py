"""Speed-up and efficiency ratios."""
from __future__ import annotations

import math

import pytest

from vitbench.errors import ParamError
from vitbench.measure import efficiency, speedup


def test_speedup_is_method_over_baseline() -> None:
    assert speedup(338.0, 200.0) == 1.69
    assert speedup(100.0, 200.0) == 0.5


def test_efficiency_of_tome_on_deit_s_example() -> None:
    # docs/measuring.md: 1.69x at 4.599 -> 2.706 GMACs is 0.99
    assert efficiency(1.69, 4.599, 2.706) == pytest.approx(1.69 * 2.706 / 4.599, rel=1e-15)
    assert efficiency(1.69, 4.599, 2.706) == pytest.approx(0.994377038, abs=1e-9)


def test_efficiency_is_one_when_every_saved_mac_becomes_time() -> None:
    assert efficiency(2.0, 10.0, 5.0) == 1.0
    assert efficiency(1.0, 10.0, 10.0) == 1.0
    assert efficiency(1.5, 10.0, 5.0) == 0.75


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, True, "2", None])
def test_speedup_refuses_non_positive_or_non_numbers(bad: object) -> None:
    with pytest.raises(ParamError, match="method_img_s") as err:
        speedup(bad, 1.0)  # type: ignore[arg-type]
    assert repr(bad) in str(err.value)
    with pytest.raises(ParamError, match="baseline_img_s"):
        speedup(1.0, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("position", ["speedup", "baseline_gmacs", "method_gmacs"])
def test_efficiency_names_the_bad_argument(position: str) -> None:
    args = {"speedup": 1.0, "baseline_gmacs": 4.6, "method_gmacs": 2.7, position: -2.5}
    with pytest.raises(ParamError, match=rf"{position} must be a positive finite number, got -2.5"):
        efficiency(**args)
