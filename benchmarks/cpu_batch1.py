"""Issue 23, item 5: how much of its possible speed-up each method keeps at batch 1 on a CPU.

    python benchmarks/cpu_batch1.py [--model deit_small_patch16_224] [--batch 1] [--threads 2]
        [--methods tome:r=13,ppt,topk] [--rounds 30] [--no-compile] [--reference /path/to/ToMe]

For each method: its GMACs, and the milliseconds per forward of the timm baseline, of the
method's *limit* (the unpatched blocks on the method's token counts,
:class:`vitbench.measure.limit.TokenCountLimit`) and of vitbench's method, eager and
``torch.compile``d; speed-ups over the baseline of the same kind, and the method's share of the
limit's speed-up. ``--reference PATH`` adds the official ToMe code (a clone of
facebookresearch/ToMe, imported from PATH at run time, its ``tome.patch.timm`` applied to a
copy of the model) for ``tome`` with an integer ``r``, and the median over rounds of its time
over vitbench's in the same round (above 1: vitbench is faster). Every model is timed in one process,
interleaved (one forward of each per round, in turn, many rounds; the median per model), so
that machine noise falls on all alike. fp32, random weights and images (speed does not depend
on them). Methods: ``name:key=value,...`` separated by commas (or ``;`` as in gpu_reduction.py).
"""
from __future__ import annotations

import argparse
import copy
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd
import timm
import torch

import vitbench
from vitbench.engine import cpu_kernels
from vitbench.environment import device_name
from vitbench.measure import count_gmacs
from vitbench.measure.compiled import compile_for_timing
from vitbench.measure.limit import TokenCountLimit, token_counts
from vitbench.measure.speed import machine_load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_reduction import _split_top_level, parse_methods  # noqa: E402  (the sibling benchmark's parser)

DEFAULT_METHODS = "tome:r=13,ppt,topk"


def split_methods(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``"tome:r=13,ppt,topk:keep=0.7,layers=(3,6,9)"`` -> ``[("tome", {"r": "13"}), ("ppt", {}),
    ("topk", {...})]``: a comma-separated piece with ``=`` and no ``:`` is a parameter of the
    method before it; ``;``-separated text is read as gpu_reduction.py reads it."""
    if ";" in text:
        return parse_methods(text)
    items: list[str] = []
    for piece in filter(None, (p.strip() for p in _split_top_level(text))):
        if "=" in piece and ":" not in piece and items:
            items[-1] += ("," if ":" in items[-1] else ":") + piece
        else:
            items.append(piece)
    return parse_methods(";".join(items))


def official_tome(base: torch.nn.Module, path: str, r: int) -> torch.nn.Module:
    """A copy of ``base`` with the official ToMe code (imported from ``path``) applied, ``r`` per block."""
    sys.path.insert(0, str(Path(path).resolve()))
    try:
        import tome  # the official code, under its own licence: imported at run time, never copied
    finally:
        sys.path.pop(0)
    model = copy.deepcopy(base)
    tome.patch.timm(model)
    model.r = r
    return model


def interleaved_ms(models: dict[str, Callable[[torch.Tensor], Any]], images: torch.Tensor, rounds: int,
                   warmup: int) -> dict[str, list[float]]:
    """Milliseconds per forward of each model: one forward of each per round, in turn."""
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for _ in range(warmup):
            for model in models.values():
                model(images)
        for _ in range(rounds):
            for name, model in models.items():
                start = time.perf_counter()
                model(images)
                times[name].append(1e3 * (time.perf_counter() - start))
    return times


def _build(args: argparse.Namespace, base: torch.nn.Module, images: torch.Tensor
           ) -> tuple[dict[str, torch.nn.Module], list[dict[str, Any]], list[str]]:
    """The eager models to time (``baseline``, ``<method> limit``, ``<method> vitbench``, maybe
    ``tome official``), a row stub per method, and notes."""
    models: dict[str, torch.nn.Module] = {"baseline": base}
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    gmacs = count_gmacs(base, images).mean
    rows.append({"method": "baseline", "GMACs": gmacs})
    for name, params in split_methods(args.methods):
        method = vitbench.apply(copy.deepcopy(base), name, **params).eval()
        models[f"{name} limit"] = TokenCountLimit(base, token_counts(method, images))
        models[f"{name} vitbench"] = method
        rows.append({"method": name + "".join(f" {k}={v}" for k, v in params.items()),
                     "key": name, "GMACs": count_gmacs(method, images).mean})
        if args.reference and name == "tome":
            r = str(params.get("r", 16))
            if not r.isdigit():
                notes.append(f"official ToMe left out: r={r} is not one integer")
                continue
            official = official_tome(base, args.reference, int(r))
            with torch.inference_mode():
                diff = (official(images) - method(images)).abs().max().item()
            notes.append(f"max |vitbench ToMe - official ToMe| logits (fp32): {diff:.2e}")
            models["tome official"] = official
    return models, rows, notes


def _compiled(models: dict[str, torch.nn.Module], images: torch.Tensor, notes: list[str]
              ) -> dict[str, torch.nn.Module]:
    out = {}
    for name, model in models.items():
        result = compile_for_timing(model, tuple(images.shape[1:]), (images.shape[0],), "cpu")
        if result.compiled:
            out[f"{name} compiled"] = result.module
        else:
            notes.append(f"{name}: {result.fallback}; left out of the compiled rows")
    return out


def _table(rows: list[dict[str, Any]], times: dict[str, list[float]], variants: list[str]) -> pd.DataFrame:
    ms = {name: statistics.median(t) for name, t in times.items()}
    table = []
    for row in rows[1:]:
        for variant in variants:
            tag = "" if variant == "eager" else " compiled"
            base, limit, ours = (ms.get(f"{k}{tag}") for k in ("baseline", f"{row['key']} limit",
                                                               f"{row['key']} vitbench"))
            if base is None or limit is None or ours is None:
                continue
            line = {"method": row["method"], "GMACs": row["GMACs"], "timed": variant, "baseline ms": base,
                    "limit ms": limit, "vitbench ms": ours, "limit x": base / limit, "vitbench x": base / ours,
                    "share of limit": limit / ours}
            official = ms.get(f"tome official{tag}") if row["key"] == "tome" else None
            if official is not None:
                paired = statistics.median(o / v for o, v in zip(times[f"tome official{tag}"],
                                                                  times[f"tome vitbench{tag}"]))
                line.update({"official ms": official, "official x": base / official,
                             "official share": limit / official, "official / vitbench (paired)": paired})
            table.append(line)
    return pd.DataFrame(table)


def _load(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main(argv: Optional[list[str]] = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default=DEFAULT_METHODS)
    parser.add_argument("--rounds", type=int, default=30, help="timed forwards of each model (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="time the eager models only")
    parser.add_argument("--reference", metavar="PATH", help="a clone of facebookresearch/ToMe: time it too")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, argv: Optional[list[str]]) -> pd.DataFrame:
    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False).eval()
    size = tuple(base.pretrained_cfg.get("input_size", (3, 224, 224)))
    images = torch.randn(args.batch, *size)

    models, rows, notes = _build(args, base, images)
    variants = ["eager"] if args.no_compile else ["eager", "compiled"]
    if not args.no_compile:
        models.update(_compiled(models, images, notes))
    load_before = machine_load().load_1min
    times = interleaved_ms(models, images, args.rounds, args.warmup)
    load_after = machine_load().load_1min
    df = _table(rows, times, variants)

    print(f"python benchmarks/cpu_batch1.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{args.model}, batch {args.batch}, fp32, {device_name('cpu')}, torch.get_num_threads() "
          f"{torch.get_num_threads()}, torch {torch.__version__}, timm {timm.__version__}; "
          f"{args.rounds} interleaved rounds (median); baseline {rows[0]['GMACs']:.2f} GMACs; "
          f"load average {_load(load_before)} before, {_load(load_after)} after; "
          f"CPU kernels: {cpu_kernels.describe()}")
    print(df.to_markdown(index=False, floatfmt=".3g"))
    for note in notes:
        print(note)
    return df


if __name__ == "__main__":
    main()
