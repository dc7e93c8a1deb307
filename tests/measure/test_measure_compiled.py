"""``--compile`` (issue 11, item 1): the timing loops run the torch.compile'd model, or the eager
one with the reason recorded (vitbench/measure/compiled.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from vitbench.measure import measure_throughput
from vitbench.measure.compiled import compile_for_timing


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_compiled_model_is_timed_and_recorded():
    model = _Tiny().eval()
    timed = compile_for_timing(model, (3, 4, 4), (2, 1), "cpu")
    assert timed.compiled and timed.module is not model and timed.record() == {"compiled": True}
    x = torch.randn(2, 3, 4, 4)
    with torch.inference_mode():
        assert torch.allclose(timed.module(x), model(x), atol=1e-6)
    assert measure_throughput(timed.module, 2, (3, 4, 4), warmup=0, repeats=1).median_img_s > 0


def test_a_model_that_does_not_compile_is_timed_eagerly_with_the_reason(monkeypatch):
    """A compiler failure at the first call (simulated: torch.compile's module raises as an
    inductor error would) leaves the eager model timed, and says why."""

    def failing_compile(model):
        def call(*args):
            raise RuntimeError("BackendCompilerFailed: simulated\nmore lines")
        return call

    monkeypatch.setattr(torch, "compile", failing_compile)
    model = _Tiny().eval()
    timed = compile_for_timing(model, (3, 4, 4), (2,), "cpu")
    assert not timed.compiled and timed.module is model
    assert timed.fallback == ("torch.compile failed (RuntimeError: BackendCompilerFailed: simulated); "
                              "timed eagerly")
    assert timed.record()["compiled"] is False and "compile_fallback" in timed.record()


@pytest.mark.slow
def test_run_with_compile_records_it(tmp_path: Path):
    from vitbench.cli.main import main

    out = tmp_path / "out"
    assert main(["run", "--model", "test_vit", "--methods", "tome", "--param", "tome.r=4", "--metrics",
                 "gmacs,throughput", "--batch-size", "2", "--compile", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["compiled"] is True and r["throughput_img_s"] > 0 for r in records)
    assert all(r["env"]["compiled"] == "torch.compile (timings)" for r in records)
    assert "- Compiled: torch.compile (timings)" in (out / "report.md").read_text()
