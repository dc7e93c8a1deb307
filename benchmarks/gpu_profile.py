"""Where a method's forward spends its time, kernel by kernel, beside the unreduced model's.

    python benchmarks/gpu_profile.py [--model vit_base_patch16_224] [--batch-size 256]
        [--precision fp16] [--methods "tome:r=16;ppt:r=50"] [--forwards 5] [--top 25]
        [--bias-channel auto|always|never] [--device cuda]

For the baseline and each method (``vitbench.apply``, parameters as ``gpu_reduction.py`` takes
them), ``--forwards`` forwards on random images are recorded by ``torch.profiler`` after three
warm-up forwards, under ``torch.autocast`` for ``--precision``. Prints per model: the device time
per forward, the kernels launched per forward, and the ``--top`` operations by their own device
time (CPU time on a CPU, which is how the tests smoke it); then the method's extra time and
kernels per forward over the baseline's. What it answers: which of a method's own operations
(matching, gathers, the bias channel's concatenations) keep it from its token-count limit in
half precision (docs/results.md, "On a GPU").
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
from pathlib import Path
from typing import Any

import timm
import torch
from torch.profiler import ProfilerActivity, profile

import vitbench
from vitbench.engine.attention import set_bias_channel
from vitbench.measure.precision import autocast, check_precision

_REDUCTION = Path(__file__).resolve().parent / "gpu_reduction.py"


def parse_methods(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``--methods`` syntax of ``gpu_reduction.py`` (its parser, loaded from the file beside this one)."""
    spec = importlib.util.spec_from_file_location("gpu_reduction", _REDUCTION)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.parse_methods(text)


def profile_forwards(model: torch.nn.Module, images: torch.Tensor, precision: str, forwards: int) -> Any:
    """The profiler of ``forwards`` forwards of ``model`` on ``images`` (after three warm-up forwards)."""
    cuda = images.is_cuda
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with torch.inference_mode(), autocast(precision, images.device):
        for _ in range(3):
            model(images)
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            for _ in range(forwards):
                model(images)
            if cuda:
                torch.cuda.synchronize()
    return prof


def summary(prof: Any, forwards: int, cuda: bool) -> dict[str, float]:
    """Device (CPU) microseconds and operations per forward, from the profiler's own-time totals."""
    events = prof.key_averages()
    own = [(e.self_device_time_total if cuda else e.self_cpu_time_total) for e in events]
    counts = [e.count for e, t in zip(events, own) if t > 0]
    return {"us_per_forward": sum(own) / forwards, "ops_per_forward": sum(counts) / forwards}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--methods", default="tome:r=16")
    parser.add_argument("--forwards", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--bias-channel", default="auto", choices=("auto", "always", "never"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    precision = check_precision(args.precision)
    old_mode = set_bias_channel(args.bias_channel)
    try:
        torch.manual_seed(0)
        base = timm.create_model(args.model, pretrained=False).eval().to(args.device)
        size = tuple(base.pretrained_cfg.get("input_size", (3, 224, 224)))
        images = torch.randn(args.batch_size, *size, device=args.device)
        cuda = images.is_cuda
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        models = [("baseline", base)] + [
            (f"{name} " + ",".join(f"{k}={v}" for k, v in params.items()),
             vitbench.apply(copy.deepcopy(base), name, **params).to(args.device))
            for name, params in parse_methods(args.methods)]
        print(f"{args.model}, batch {args.batch_size}, {precision}, {args.forwards} forwards, device "
              f"{torch.cuda.get_device_name(images.device) if cuda else 'cpu'}, torch {torch.__version__}, "
              f"bias channel {args.bias_channel}")
        out: dict[str, dict[str, float]] = {}
        for label, model in models:
            prof = profile_forwards(model, images, precision, args.forwards)
            out[label] = summary(prof, args.forwards, cuda)
            print(f"\n== {label}: {out[label]['us_per_forward'] / 1e3:.2f} ms and "
                  f"{out[label]['ops_per_forward']:.0f} operations per forward")
            print(prof.key_averages().table(sort_by=sort, row_limit=args.top, max_name_column_width=60))
        first = out["baseline"]
        for label, row in out.items():
            if label != "baseline":
                print(f"{label}: {row['us_per_forward'] / first['us_per_forward']:.3f}x the baseline's time, "
                      f"{row['ops_per_forward'] - first['ops_per_forward']:+.0f} operations per forward")
        return out
    finally:
        set_bias_channel(old_mode)


if __name__ == "__main__":
    main()
