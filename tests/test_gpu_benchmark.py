"""benchmarks/gpu_reduction.py runs end to end (on the CPU, tiny model): one row per baseline,
limit and method per precision, and ToMe's exactness line (issue 11, item 3)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_reduction.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_reduction", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_methods():
    bench = _load()
    assert bench.parse_methods("tome:r=16;topk:keep=0.7,layers=(1,3)") == [
        ("tome", {"r": "16"}), ("topk", {"keep": "0.7", "layers": "(1,3)"})]


def test_a_method_given_twice_is_labelled_by_the_parameters_that_differ():
    bench = _load()
    methods = bench.parse_methods("tome:r=16;tome:r=16,prop_attn=False;topk:keep=0.7")
    assert [shown for _, _, shown in bench.labelled(methods)] == ["tome", "tome prop_attn=False", "topk"]


def test_tome_with_and_without_proportional_attention_side_by_side(capsys):
    bench = _load()
    df = bench.main(["--model", "test_vit", "--batch-size", "2", "--repeats", "1", "--precisions", "fp32",
                     "--methods", "tome:r=4;tome:r=4,prop_attn=False", "--device", "cpu"])
    assert list(df["row"]) == ["baseline", "tome limit", "tome vitbench", "tome prop_attn=False limit",
                               "tome prop_attn=False vitbench"]
    assert df["of limit"].notna().sum() == 2  # each against its own limit


def test_benchmark_smoke_on_cpu(capsys):
    bench = _load()
    df = bench.main(["--model", "test_vit", "--batch-size", "2", "--repeats", "1", "--precisions", "fp32,bf16",
                     "--methods", "tome:r=4;topk:keep=0.5,layers=(1,3)", "--device", "cpu"])
    assert list(df["row"]) == ["baseline", "tome limit", "tome vitbench", "topk limit", "topk vitbench"] * 2
    assert set(df["precision"]) == {"fp32", "bf16"} and (df["img/s"] > 0).all()
    assert df["of limit"].notna().sum() == 4  # one share per method and precision
    out = capsys.readouterr().out
    assert "| row " in out and "max |vitbench ToMe - reference ToMe (fp32)| logits: fp32 " in out
    fp32_diff = float(out.split("logits: fp32 ")[1].split(",")[0])
    assert fp32_diff < 1e-4


def test_cuda_graph_rows_fall_back_on_cpu(capsys):
    """--cuda-graph on a CPU: the graphed rows are left out, and the reason printed."""
    bench = _load()
    df = bench.main(["--model", "test_vit", "--batch-size", "2", "--repeats", "1", "--precisions", "fp32",
                     "--methods", "tome:r=4", "--device", "cpu", "--cuda-graph", "--bias-channel", "always"])
    assert list(df["timed"]) == ["eager"] * 3
    out = capsys.readouterr().out
    assert "baseline, fp32, cuda graph: CUDA graphs need a CUDA device" in out
    assert "bias channel always" in out
    fp32_diff = float(out.split("logits: fp32 ")[1].split(",")[0])
    assert fp32_diff < 1e-4  # the bias as an extra channel: still ToMe's logits


def test_profile_smoke_on_cpu(capsys):
    """benchmarks/gpu_profile.py on the CPU: a table per model and the method's extra per forward."""
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT.parent / "gpu_profile.py")
    profiler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profiler)
    out = profiler.main(["--model", "test_vit", "--batch-size", "2", "--precision", "fp32", "--forwards", "1",
                         "--methods", "tome:r=4", "--device", "cpu", "--top", "5"])
    assert list(out) == ["baseline", "tome r=4"]
    assert all(row["us_per_forward"] > 0 and row["ops_per_forward"] > 0 for row in out.values())
    assert out["tome r=4"]["ops_per_forward"] > out["baseline"]["ops_per_forward"]  # the matching's own work
    text = capsys.readouterr().out
    assert "== baseline:" in text and "tome r=4: " in text and "operations per forward" in text
