"""The plugin tests itself with vitbench's plugin-author kit (fixtures from vitbench.testing)."""
from __future__ import annotations

import pytest
import torch

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError


def test_random_drop_conforms(vitbench_check_method):
    vitbench_check_method("random-drop")


def test_random_drop_keeps_the_declared_token_counts(vitbench_tiny_vit):
    # 64 patches + cls: 64 -> 32 at block 3 -> 16 at block 6 -> 8 at block 9, cls kept.
    model = vitbench.apply(vitbench_tiny_vit(), "random-drop", keep=0.5)
    with torch.inference_mode():
        model(torch.randn(2, 3, 32, 32))
    assert reduction_context(model).token_counts == [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3


@pytest.mark.parametrize("bad", [{"keep": 0.0}, {"keep": 1.5}, {"layers": "(-1,)"}, {"seed": -1}])
def test_random_drop_rejects_out_of_range_params(vitbench_tiny_vit, bad):
    with pytest.raises(ParamError, match="random-drop"):
        vitbench.apply(vitbench_tiny_vit(), "random-drop", **bad)
