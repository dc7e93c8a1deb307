"""GMACs of the reduced DeiT-S against the values the official implementations count on the
same timm (docs/methods.md §1 and §3): ToMe r=13 4.599 -> 2.706, PPT 4.599 -> 2.942."""
from __future__ import annotations

import copy

import pytest

import vitbench
from vitbench.measure import count_gmacs_at


@pytest.mark.parametrize("method, params, expected", [
    (None, {}, 4.599),
    ("tome", {"r": 13}, 2.706),
    ("ppt", {}, 2.942),
])
def test_deit_small_gmacs_match_the_reference_implementations(deit_small, method, params, expected):
    model = copy.deepcopy(deit_small)
    if method:
        model = vitbench.apply(model, method, **params)
    assert count_gmacs_at(model).mean == pytest.approx(expected, abs=0.0015)
