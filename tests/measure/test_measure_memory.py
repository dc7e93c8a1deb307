"""Peak memory: sane values and a known allocation seen (no cross-batch comparisons: flaky)."""
from __future__ import annotations

import math
import mmap
import time

import pytest
import torch
from torch import nn

from vitbench.errors import ParamError
from vitbench.measure import measure_peak_memory
from vitbench.measure.memory import _maxrss_growth, _rss_reader, _sampled_growth, cpu_rss_growth_bytes

MIB = 2**20


class Allocates(nn.Module):
    """Holds a freshly written ``mib``-MiB tensor for a moment in every forward."""

    def __init__(self, mib: int) -> None:
        super().__init__()
        self.mib = mib

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = torch.ones(self.mib * MIB // 4)  # float32
        time.sleep(0.02)  # long enough for the sampling fallback too
        return x + big[0]


def hold(mib: int, seconds: float = 0.02) -> None:
    """Write ``mib`` MiB of pages the process never held before, for ``seconds``: a fresh anonymous
    mapping (a tensor could reuse pages the allocator kept from earlier tests; RSS would not grow)."""
    with mmap.mmap(-1, mib * MIB) as buf:
        pages = torch.frombuffer(buf, dtype=torch.uint8)
        pages.fill_(1)
        time.sleep(seconds)
        del pages


def test_tiny_vit_reports_a_non_negative_float_and_restores_training(tiny_vit: nn.Module) -> None:
    tiny_vit.train()
    mb = measure_peak_memory(tiny_vit, batch_size=4, input_size=(3, 32, 32))
    assert isinstance(mb, float)
    assert math.isfinite(mb) and mb >= 0
    assert tiny_vit.training


def test_sees_a_known_allocation_during_the_forward() -> None:
    mb = measure_peak_memory(Allocates(64), batch_size=1, input_size=(1, 2, 2))
    assert mb >= 48  # 64 MiB written; allow allocator slack, never a hard upper bound


def test_best_method_sees_a_known_allocation() -> None:
    assert cpu_rss_growth_bytes(lambda: hold(64)) >= 48 * MIB


def test_sampling_fallback_sees_a_known_allocation() -> None:
    reader = _rss_reader()
    if reader is None:
        pytest.skip("no RSS reader on this platform")
    assert reader() > 0
    # held 0.2 s: a sampler thread on a loaded 2-core machine can wait tens of ms for a core
    assert _sampled_growth(lambda: hold(64, seconds=0.2), reader) >= 48 * MIB


def test_maxrss_fallback_is_a_non_negative_int() -> None:
    growth = _maxrss_growth(lambda: hold(1))
    assert isinstance(growth, int) and growth >= 0


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_bad_batch_size_is_refused(bad: object) -> None:
    with pytest.raises(ParamError, match=rf"batch_size must be .*got {bad!r}"):
        measure_peak_memory(Allocates(1), batch_size=bad, input_size=(1, 2, 2))  # type: ignore[arg-type]


def test_other_devices_are_refused_before_running() -> None:
    with pytest.raises(ParamError, match="'cpu' or 'cuda' only, got device='meta'"):
        measure_peak_memory(Allocates(1), batch_size=1, input_size=(1, 2, 2), device="meta")
