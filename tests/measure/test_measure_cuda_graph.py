"""``--cuda-graph`` (issue 11, item 1): the timing loops replay a CUDA graph of the forward where its
shapes are static, and time it eagerly with the reason recorded where they are not
(vitbench/measure/cuda_graph.py). The CPU tests check the fallback and the CLI record; the CUDA
tests (skipped without a GPU; run on the lent device) capture ToMe, top-k and PPT and refuse ATS."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import vitbench
from vitbench.measure import measure_latency
from vitbench.measure.cuda_graph import GraphedForward, graph_for_timing

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def test_a_cpu_run_is_timed_without_a_graph_and_says_why(tiny_vit):
    timed = graph_for_timing(tiny_vit, (3, 32, 32), (2, 1), "cpu")
    assert not timed.graphed and timed.module is tiny_vit
    assert timed.record() == {"cuda_graph": False, "cuda_graph_fallback":
                              "CUDA graphs need a CUDA device (the run is on cpu); timed without a CUDA graph"}


def test_graphed_forward_refuses_a_shape_it_did_not_capture(tiny_vit):
    with pytest.raises(ValueError, match=r"no CUDA graph was captured for an input of shape \(3, 3, 32, 32\)"):
        GraphedForward(tiny_vit)(torch.zeros(3, 3, 32, 32))


@pytest.mark.slow
def test_run_with_cuda_graph_on_the_cpu_records_the_fallback(tmp_path: Path):
    from vitbench.cli.main import main

    out = tmp_path / "out"
    assert main(["run", "--model", "test_vit", "--methods", "tome", "--param", "tome.r=4", "--metrics",
                 "gmacs,latency", "--batch-size", "2", "--cuda-graph", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["cuda_graph"] is False and "CUDA graphs need a CUDA device" in r["cuda_graph_fallback"]
               for r in records)
    assert all(r["latency_ms"] > 0 for r in records)
    report = (out / "report.md").read_text()
    assert "- CUDA graph: CUDA graph where the shapes are static" in report
    assert "timed without a CUDA graph: CUDA graphs need a CUDA device" in report


@cuda
@pytest.mark.parametrize("method,params", [("tome", {"r": 4}), ("topk", {"keep": 0.5, "layers": (1,)}),
                                           ("ppt", {"r": 6, "layers": (1,)}), ("ppt", {"r": 6, "layers": (1,),
                                                                                      "threshold": 1e9})])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_static_methods_are_captured_and_replay_the_eager_forward(tiny_vit, method, params, precision):
    model = vitbench.apply(copy.deepcopy(tiny_vit), method, **params).cuda().eval()
    timed = graph_for_timing(model, (3, 32, 32), (4, 1), "cuda", precision)
    assert timed.graphed, timed.fallback
    x = torch.randn(4, 3, 32, 32, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16 if precision == "fp16" else
                                                torch.bfloat16, enabled=precision != "fp32"):
        eager = model(x).float()
        replayed = timed.module(x).float()
    assert torch.allclose(replayed, eager, atol=2e-2 * float(eager.abs().max()))
    assert measure_latency(timed.module, (3, 32, 32), device="cuda", repeats=3, precision=precision).median_ms > 0


@cuda
def test_a_method_with_data_dependent_shapes_is_timed_eagerly_with_the_reason(tiny_vit):
    model = vitbench.apply(copy.deepcopy(tiny_vit), "ats", layers=(1,)).cuda().eval()
    timed = graph_for_timing(model, (3, 32, 32), (2,), "cuda")
    assert not timed.graphed and timed.module is model  # ATS sizes its padded batch by the widest image
    assert timed.fallback.startswith("the forward reads a device value on the host at batch 2")
    assert timed.fallback.endswith("timed without a CUDA graph")
