"""benchmarks/cpu_batch1.py (issue 23, item 5) parses its methods and prints one table with a row
per method, the command line, the processor and the threads (on the tiny model, eager only)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_batch1.py"


def _load():
    spec = importlib.util.spec_from_file_location("cpu_batch1", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_split_methods_commas_and_semicolons():
    bench = _load()
    assert bench.split_methods("tome:r=13,ppt,topk") == [("tome", {"r": "13"}), ("ppt", {}), ("topk", {})]
    assert bench.split_methods("ppt,layers=(1,3),r=4,topk:keep=0.5") == [
        ("ppt", {"layers": "(1,3)", "r": "4"}), ("topk", {"keep": "0.5"})]
    assert bench.split_methods("tome:r=4;topk:keep=0.5,layers=(1,3)") == [
        ("tome", {"r": "4"}), ("topk", {"keep": "0.5", "layers": "(1,3)"})]


def test_smoke_on_the_tiny_model(capsys):
    bench = _load()
    argv = ["--model", "test_vit", "--threads", "1", "--rounds", "1", "--warmup", "0", "--no-compile",
            "--copies", "2", "--methods", "tome:r=4,topk:keep=0.5,layers=(1,3)"]
    df = bench.main(argv)
    assert list(df["method"]) == ["tome r=4", "topk keep=0.5 layers=(1,3)"]
    assert list(df["timed"]) == ["eager", "eager"]
    assert (df["GMACs"] > 0).all() and (df["share of limit"] > 0).all()
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "python benchmarks/cpu_batch1.py " + " ".join(
        a if "(" not in a else f"'{a}'" for a in argv)
    assert "torch.get_num_threads() 1" in out and "| method " in out and "2 copies of each model" in out


def test_a_rounds_time_is_the_mean_over_the_copies():
    bench = _load()
    times = {"baseline#0": [1.0, 4.0], "baseline#1": [3.0, 2.0], "tome vitbench#0": [5.0, 5.0]}
    assert bench._per_model(times) == {"baseline": [2.0, 3.0], "tome vitbench": [5.0, 5.0]}


def test_each_compiled_model_has_a_dynamo_cache_of_its_own():
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    bench = _load()
    torch.manual_seed(0)
    models = [bench.OwnCache(torch.nn.Linear(4, 2), f"linear#{i}") for i in range(2)]
    compiled = [torch.compile(m) for m in models]
    x = torch.randn(3, 4)
    for _ in range(2):
        for model, fast in zip(models, compiled):
            assert torch.allclose(fast(x), model.model(x))
    codes = [m.forward.__code__ for m in models]
    assert codes[0] is not codes[1]
    assert [len(_debug_get_cache_entry_list(code)) for code in codes] == [1, 1]


def test_tome_overhead_models_run_on_tomes_token_counts(capsys):
    # benchmarks/cpu_tome_overhead.py: every model it times runs ToMe's token counts, so the
    # differences it prints are the cost of the steps switched on, not of other counts
    spec = importlib.util.spec_from_file_location("cpu_tome_overhead", SCRIPT.with_name("cpu_tome_overhead.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import timm
    import torch

    from vitbench.engine import reduction_context

    torch.manual_seed(0)
    base = timm.create_model("test_vit", pretrained=False).eval()
    images = torch.randn(1, *base.pretrained_cfg["input_size"])
    models = bench.overhead_models(base, 4, images)
    counts = models["limit"].counts
    for name, model in list(models.items())[1:]:
        with torch.inference_mode():
            model(images)
        assert reduction_context(model).token_counts == counts, name
    over = bench.main(["--model", "test_vit", "--r", "4", "--threads", "1", "--rounds", "2"])
    assert list(over) == ["limit", "blocks + keys", "+ prop attn", "+ matching", "+ merge (ToMe)"]
    out = capsys.readouterr().out
    assert out.startswith("python benchmarks/cpu_tome_overhead.py --model test_vit") and "| + merge (ToMe) |" in out
