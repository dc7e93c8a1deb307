"""The plugin tests itself with vitbench's plugin-author kit (fixtures from vitbench.testing)."""
from __future__ import annotations

import pytest
import torch

import vitbench
from vitbench.kit import AttnInfo, Reducer, TokenState, reduction_context
from vitbench.errors import ParamError
from vitbench_example_plugin.random_drop import RandomDropReducer


def test_random_drop_conforms(vitbench_check_method):
    vitbench_check_method("random-drop")


def test_random_drop_builds_reducers_of_the_contract(vitbench_tiny_vit):
    model = vitbench.apply(vitbench_tiny_vit(), "random-drop")
    reducers = [block.reducer for block in model.blocks]
    assert [i for i, r in enumerate(reducers) if r is not None] == [3, 6, 9]
    assert all(isinstance(reducers[i], Reducer) for i in (3, 6, 9))


def test_random_drop_keeps_the_declared_token_counts(vitbench_tiny_vit):
    # 64 patches + cls: 64 -> 32 at block 3 -> 16 at block 6 -> 8 at block 9, cls kept.
    model = vitbench.apply(vitbench_tiny_vit(), "random-drop", keep=0.5)
    with torch.inference_mode():
        model(torch.randn(2, 3, 32, 32))
    assert reduction_context(model).token_counts == [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3


def test_random_drop_keeps_the_prefix_first_and_a_seeded_ordered_subset():
    x = torch.arange(2 * 9, dtype=torch.float32).reshape(2, 9, 1)  # 1 prefix + 8 patches
    out = RandomDropReducer(0.5, seed=7)(x, TokenState(prefix=1), AttnInfo())
    assert out.shape == (2, 5, 1)
    assert torch.equal(out[:, 0], x[:, 0])
    assert bool((out[:, 1:].diff(dim=1) > 0).all())  # patches kept in their original order
    assert torch.equal(out, RandomDropReducer(0.5, seed=7)(x, TokenState(prefix=1), AttnInfo()))


@pytest.mark.parametrize("bad, message", [
    ({"keep": 0.0}, r"random-drop\.keep=0\.0 is out of range"),
    ({"keep": 1.5}, r"random-drop\.keep=1\.5 is out of range"),
    ({"layers": "[3, -1]"}, r"random-drop\.layers=\[3, -1\]: block indices are >= 0"),
    ({"layers": "[3, 12]"}, r"random-drop\.layers contains 12; valid block indices for this model: 0\.\.11"),
    ({"seed": -1}, r"random-drop\.seed=-1 is out of range"),
])
def test_random_drop_rejects_out_of_range_params(vitbench_tiny_vit, bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(vitbench_tiny_vit(), "random-drop", **bad)
