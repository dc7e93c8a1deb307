"""``--seeds``: the plan runs each spec once per seed, the baseline of each seed first."""
from __future__ import annotations

import pytest

from vitbench.errors import ParamError
from vitbench.run.plan import build_plan, build_seeded_plan, parse_seeds

COMMON = dict(task="cls", model="test_vit", methods=["tome", "ppt"], data=None, overrides={"tome": {"r": "4"}},
              metrics=("gmacs",), batch_size=2, device="cpu")


def test_each_spec_once_per_seed_baseline_first():
    plan = build_seeded_plan(seeds=(0, 1, 2), **COMMON)
    assert [(s.method, s.seed) for s in plan] == [
        (m, seed) for seed in (0, 1, 2) for m in ("baseline", "tome", "ppt")]
    assert len({s.spec_id for s in plan}) == 9  # each seed's run is stored and resumed on its own
    one = build_plan(seed=1, **COMMON)
    assert plan[3:6] == one  # the same specs as a single --seed 1 plan
    assert plan[1].params == plan[4].params and plan[1].label == plan[4].label == "tome (r=4)"


def test_one_seed_is_the_single_seed_plan():
    assert build_seeded_plan(seeds=[7], **COMMON) == build_plan(seed=7, **COMMON)


@pytest.mark.parametrize("text, message", [
    ("", "--seeds is empty"),
    ("0,x", "--seeds item 'x' is not an integer"),
    ("0,1,0", "--seeds names seed 0 twice (0,1,0)"),
    ("0,-2", "seed -2 is out of range; seeds are integers >= 0"),
    ("0,99999999999", "seed 99999999999 is out of range; seeds are integers >= 0 and <= 4294967295 (2**32 - 1)"),
    ("4294967296", "seed 4294967296 is out of range"),
])
def test_bad_seeds(text, message):
    with pytest.raises(ParamError, match=None) as info:
        parse_seeds(text)
    assert message in str(info.value)


def test_parse_seeds():
    assert parse_seeds("0, 1,2") == (0, 1, 2)
    assert parse_seeds("5") == (5,)


def test_the_largest_seed_numpy_takes_is_valid():
    assert parse_seeds("0,4294967295") == (0, 2**32 - 1)
