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
            "--methods", "tome:r=4,topk:keep=0.5,layers=(1,3)"]
    df = bench.main(argv)
    assert list(df["method"]) == ["tome r=4", "topk keep=0.5 layers=(1,3)"]
    assert list(df["timed"]) == ["eager", "eager"]
    assert (df["GMACs"] > 0).all() and (df["share of limit"] > 0).all()
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "python benchmarks/cpu_batch1.py " + " ".join(
        a if "(" not in a else f"'{a}'" for a in argv)
    assert "torch.get_num_threads() 1" in out and "| method " in out
