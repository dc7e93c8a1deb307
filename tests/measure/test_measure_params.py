"""Parameter counts in millions."""
from __future__ import annotations

import pytest
from torch import nn

from vitbench.errors import ParamError
from vitbench.measure import count_params_m


def test_deit_small_has_22_05_million_parameters(deit_s: nn.Module) -> None:
    assert count_params_m(deit_s) == 22_050_664 / 1e6
    assert round(count_params_m(deit_s), 2) == 22.05


def test_counts_frozen_parameters_once_and_no_buffers() -> None:
    shared = nn.Linear(10, 10)  # 110 parameters
    model = nn.Sequential(shared, shared, nn.BatchNorm1d(10))  # BN: 20 parameters + buffers
    model[2].weight.requires_grad_(False)
    assert count_params_m(model) == 130 / 1e6


def test_refuses_a_non_module() -> None:
    with pytest.raises(ParamError, match=r"torch\.nn\.Module, got dict"):
        count_params_m({})  # type: ignore[arg-type]
