"""Paired speed-up: the order of forwards, the per-round ratio and its median, on a fake clock
(no timing thresholds: CI is noisy)."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from vitbench.errors import ParamError
from vitbench.measure import speed
from vitbench.measure.paired import PairedSpeedup, measure_paired_speedup


class Clock:
    """A perf_counter that only moves when a :class:`Costly` forward runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Costly(nn.Module):
    """A forward that takes ``costs[i]`` fake seconds on its i-th call (the last cost repeating),
    logging its name, mode and inference flag."""

    def __init__(self, name: str, costs: list[float], clock: Clock, log: list[tuple[str, bool, bool]]) -> None:
        super().__init__()
        self.name, self.costs, self.clock, self.log = name, costs, clock, log
        self.scale = nn.Parameter(torch.ones(()))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.now += self.costs[min(self.calls, len(self.costs) - 1)]
        self.calls += 1
        self.log.append((self.name, self.training, torch.is_inference_mode_enabled()))
        return x * self.scale


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(speed.time, "perf_counter", fake)
    return fake


def test_speedup_is_the_median_of_baseline_over_method_seconds(clock: Clock) -> None:
    log: list[tuple[str, bool, bool]] = []
    base = Costly("base", [3.0], clock, log)
    # warm-up 1 forward, then rounds costing 2, 1, 2, 4, 2 s: ratios 1.5, 3, 1.5, 0.75, 1.5
    method = Costly("method", [9.0, 2.0, 1.0, 2.0, 4.0, 2.0], clock, log)
    result = measure_paired_speedup(method, base, 2, (1, 2, 2), warmup=1, rounds=5)
    assert isinstance(result, PairedSpeedup)
    assert result.speedup == pytest.approx(1.5)
    assert result.spread == pytest.approx(0.0)  # Q1 = Q3 = 1.5: one slow round moves nothing
    assert (result.rounds, result.warmup, result.batch_size) == (5, 1, 2)


def test_rounds_alternate_which_model_goes_first_in_eval_and_inference_mode(clock: Clock) -> None:
    log: list[tuple[str, bool, bool]] = []
    base, method = Costly("base", [1.0], clock, log).train(), Costly("method", [1.0], clock, log).train()
    measure_paired_speedup(method, base, 1, (1, 2, 2), warmup=1, rounds=4)
    names = [name for name, _, _ in log]
    assert names == ["base", "method"] + ["base", "method", "method", "base"] * 2
    assert all(not training and inference for _, training, inference in log)
    assert base.training and method.training  # modes restored as found


def test_fields_name_the_paired_speedup_and_its_facts(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    log: list[tuple[str, bool, bool]] = []
    result = measure_paired_speedup(Costly("m", [1.0], clock, log), Costly("b", [2.0], clock, log), 1, (1, 2, 2),
                                    warmup=0, rounds=3)
    fields = result.fields()
    assert fields["speedup"] == pytest.approx(2.0) and fields["speedup_paired"] is True
    assert fields["speedup_rounds"] == 3 and fields["speedup_spread"] == pytest.approx(0.0)
    assert {"speedup_load_before", "speedup_cores", "speedup_threads", "speedup_flagged"} <= set(fields)
    assert fields["speedup_flagged"] is False and fields["speedup_load_before"] == 0.5


def test_rounds_that_disagree_flag_the_speedup(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    log: list[tuple[str, bool, bool]] = []
    result = measure_paired_speedup(Costly("m", [1.0, 2.0, 1.0, 2.0], clock, log), Costly("b", [2.0], clock, log),
                                    1, (1, 2, 2), warmup=0, rounds=4)
    assert result.speedup == pytest.approx(1.5)  # ratios 2, 1, 2, 1
    assert result.doubt is not None and "spread" in result.doubt


def test_bad_rounds_or_a_model_elsewhere_is_a_param_error() -> None:
    model, base = nn.Linear(2, 2), nn.Linear(2, 2)
    with pytest.raises(ParamError, match="rounds"):
        measure_paired_speedup(model, base, 1, (1, 2, 2), rounds=0)
    with pytest.raises(ParamError, match="model has no values to run: .* is on the meta device"):
        measure_paired_speedup(model, base.to("meta"), 1, (1, 2, 2))
