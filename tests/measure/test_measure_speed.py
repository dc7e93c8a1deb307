"""Throughput and latency: structure and invariants only (no timing thresholds: CI is noisy)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vitbench.errors import ParamError, VitbenchError
from vitbench.measure import (
    LatencyResult,
    ThroughputResult,
    default_warmup,
    measure_latency,
    measure_throughput,
)
from vitbench.measure._common import median_and_iqr

TINY = (3, 32, 32)


class Probe(nn.Module):
    """Records, per forward, the batch size, training flag and inference mode it ran under."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.calls: list[tuple[int, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((x.shape[0], self.training, torch.is_inference_mode_enabled()))
        return self.linear(x.mean(dim=(2, 3)).expand(-1, 4))


def test_throughput_structure_and_training_flag(tiny_vit: nn.Module) -> None:
    tiny_vit.train()
    result = measure_throughput(tiny_vit, batch_size=4, input_size=TINY, repeats=3)
    assert isinstance(result, ThroughputResult)
    assert result.batch_size == 4
    assert result.repeats == 3
    assert result.warmup == default_warmup(3) == 2
    assert math.isfinite(result.median_img_s) and result.median_img_s > 0
    assert math.isfinite(result.spread_img_s) and result.spread_img_s >= 0
    assert tiny_vit.training


def test_latency_structure(tiny_vit: nn.Module) -> None:
    tiny_vit.eval()
    result = measure_latency(tiny_vit, input_size=TINY, warmup=1, repeats=4)
    assert isinstance(result, LatencyResult)
    assert (result.repeats, result.warmup) == (4, 1)
    assert math.isfinite(result.median_ms) and result.median_ms > 0
    assert math.isfinite(result.spread_ms) and result.spread_ms >= 0
    assert not tiny_vit.training  # left in eval, as found


def test_forwards_run_in_eval_and_inference_mode_warmup_plus_repeats() -> None:
    probe = Probe().train()
    measure_throughput(probe, batch_size=5, input_size=(1, 2, 2), warmup=3, repeats=4)
    assert probe.calls == [(5, False, True)] * 7
    assert probe.training
    probe.calls.clear()
    measure_latency(probe, input_size=(1, 2, 2), warmup=0, repeats=2)
    assert probe.calls == [(1, False, True)] * 2


def test_default_warmup() -> None:
    assert default_warmup(1) == 2
    assert default_warmup(10) == 3  # 25% of runs, rounded up
    assert default_warmup(100) == 25
    assert default_warmup(10, "cuda") == 10
    assert default_warmup(100, "cuda") == 25


def test_median_and_iqr() -> None:
    assert median_and_iqr([5.0]) == (5.0, 0.0)
    assert median_and_iqr([1.0, 2.0, 3.0, 4.0, 100.0]) == (3.0, 2.0)  # outlier does not widen it
    assert median_and_iqr([4.0, 1.0, 3.0, 2.0]) == (2.5, 1.5)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "8"])
def test_bad_batch_size_is_refused(bad: object) -> None:
    with pytest.raises(ParamError, match="batch_size") as err:
        measure_throughput(Probe(), batch_size=bad, input_size=(1, 2, 2))  # type: ignore[arg-type]
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"repeats": 0}, "repeats must be >= 1, got 0"),
        ({"warmup": -1}, "warmup must be >= 0, got -1"),
        ({"input_size": (3, 0, 32)}, "(3, 0, 32)"),
        ({"input_size": "3x32x32"}, "'3x32x32'"),
        ({"device": "nonsense"}, "'nonsense'"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], fragment: str) -> None:
    args: dict[str, object] = {"input_size": (1, 2, 2), **kwargs}
    with pytest.raises(ParamError) as err:
        measure_latency(Probe(), **args)  # type: ignore[arg-type]
    assert fragment in str(err.value)


def test_a_model_on_the_meta_device_is_refused() -> None:
    model = Probe().to("meta")
    with pytest.raises(ParamError, match=r"model has no values to run: .* is on the meta device"):
        measure_throughput(model, batch_size=2, input_size=(1, 2, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is missing")
def test_cuda_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(VitbenchError, match="CUDA is not available"):
        measure_latency(Probe(), input_size=(1, 2, 2), device="cuda")


def test_timings_record_load_before_and_after_cores_and_threads(monkeypatch) -> None:
    import os

    import vitbench.measure.load as load

    loads = iter([(3.0, 1.0, 1.0), (5.0, 2.0, 1.0), (0.2, 0.1, 0.1), (0.3, 0.1, 0.1)])
    monkeypatch.setattr(os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(load, "usable_cores", lambda: 2)
    probe = Probe()
    busy = measure_throughput(probe, batch_size=2, input_size=(1, 2, 2), warmup=0, repeats=3)
    assert (busy.load_before, busy.load_after, busy.cores) == (3.0, 5.0, 2)
    assert busy.threads == torch.get_num_threads()
    fields = busy.fields()
    assert fields["throughput_img_s"] == busy.median_img_s
    assert (fields["throughput_load_before"], fields["throughput_load_after"]) == (3.0, 5.0)
    assert (fields["throughput_cores"], fields["throughput_threads"]) == (2, torch.get_num_threads())
    assert fields["throughput_spread_ratio"] == busy.spread_img_s / busy.median_img_s
    assert fields["throughput_flagged"] is True
    assert "load average 3.00/5.00 before/after above 2 cores + 0.5" in fields["throughput_flag_reason"]

    idle = measure_latency(probe, input_size=(1, 2, 2), warmup=0, repeats=3).fields()
    assert (idle["latency_load_before"], idle["latency_load_after"]) == (0.2, 0.3)
    assert "load" not in (idle["latency_flag_reason"] or "")  # the spread alone may still flag it
    assert idle["latency_flagged"] is (idle["latency_flag_reason"] is not None)


def test_no_load_average_is_recorded_as_unknown(monkeypatch) -> None:
    import os

    def unavailable():
        raise OSError("no /proc/loadavg")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    result = measure_latency(Probe(), input_size=(1, 2, 2), warmup=0, repeats=2)
    assert (result.load_before, result.load_after) == (None, None)
    assert "load" not in (result.doubt or "")
