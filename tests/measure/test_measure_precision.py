"""``--precision``: autocast of the measured forward (issue 11, item 1; vitbench/measure/precision.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vitbench.errors import UnknownNameError
from vitbench.measure import measure_latency, measure_throughput
from vitbench.measure.precision import PRECISIONS, autocast, check_precision, dtype_of, trains_in


class _DtypeSpy(nn.Module):
    """A linear layer that remembers the dtype its matmul ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 4)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1))
        self.seen.append(out.dtype)
        return out


def test_precisions_and_a_clear_error():
    assert PRECISIONS == ("fp32", "fp16", "bf16")
    assert dtype_of("bf16") is torch.bfloat16 and dtype_of("fp16") is torch.float16 and dtype_of("fp32") is torch.float32
    with pytest.raises(UnknownNameError, match="unknown precision 'fp8'; valid precisions: bf16, fp16, fp32"):
        check_precision("fp8")


def test_fine_tuning_precision():
    """bf16 fine-tunes in bf16; fp16 fine-tunes in fp32 (no loss scaler beside the non-finite guard)."""
    assert [trains_in(p) for p in PRECISIONS] == ["fp32", "fp32", "bf16"]


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_timed_forwards_run_in_the_precision(precision, dtype):
    model = _DtypeSpy()
    tp = measure_throughput(model, 2, (3, 8, 8), warmup=1, repeats=2, precision=precision)
    lat = measure_latency(model, (3, 8, 8), warmup=0, repeats=1, precision=precision)
    assert tp.median_img_s > 0 and lat.median_ms > 0
    assert set(model.seen) == {dtype}
    assert model.fc.weight.dtype == torch.float32  # autocast: the weights stay fp32


def test_autocast_outside_is_untouched():
    with autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_method_patches_for_the_context_only():
    """What evaluation uses inside mmengine's TestLoop: the method runs under autocast (even
    inside an ``autocast(enabled=False)``), ``to_float`` hands fp32 tensors on, and the instance
    is restored afterwards."""
    from vitbench.measure.precision import autocast_method

    spy = _DtypeSpy()
    x = torch.randn(2, 3, 8, 8)
    with autocast_method(spy, "forward", "bf16", "cpu", to_float=True):
        with torch.autocast("cpu", enabled=False):  # what mmengine's TestLoop opens per iteration
            out = spy.forward(x)
    assert spy.seen == [torch.bfloat16] and out.dtype == torch.float32
    assert "forward" not in vars(spy)
    with autocast_method(spy, "forward", "fp32", "cpu"):
        assert "forward" not in vars(spy)  # fp32: nothing patched
