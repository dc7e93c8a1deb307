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


def _four_block_vit() -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10).eval()


@pytest.mark.parametrize("method, params", [("tome", {"r": 8}), ("ppt", {"layers": (1, 2), "r": 8}),
                                            ("topk", {"layers": (1, 2)})])
def test_a_reduced_vit_compiles_to_one_graph_without_breaks(method, params):
    """The whole reduced forward is one graph (issue 23, item 5): no host reads (PPT's branch,
    the prefix check of ``keep``) and no per-block recompiles; its logits are the eager ones."""
    import vitbench

    model = vitbench.apply(_four_block_vit(), method, **params).eval()
    x = torch.randn(1, 3, 32, 32)
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        assert torch.allclose(compiled(x), model(x), atol=1e-5)
    torch._dynamo.reset()
