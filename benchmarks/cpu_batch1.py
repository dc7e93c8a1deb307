"""Issue 23, item 5: how much of its possible speed-up each method keeps at batch 1 on a CPU.

    python benchmarks/cpu_batch1.py [--model deit_small_patch16_224] [--batch 1] [--threads 2]
        [--methods tome:r=13,ppt,topk] [--rounds 30] [--copies 3] [--no-compile]
        [--reference /path/to/ToMe]

For each method: its GMACs, and the milliseconds per forward of the timm baseline, of the
method's *limit* (the unpatched blocks on the method's token counts,
:class:`vitbench.measure.limit.TokenCountLimit`) and of vitbench's method, eager and
``torch.compile``d; speed-ups over the baseline of the same kind, and the method's share of the
limit's speed-up. ``--reference PATH`` adds the official ToMe code (a clone of
facebookresearch/ToMe, imported from PATH at run time, its ``tome.patch.timm`` applied to a
copy of the model) for ``tome`` with an integer ``r``, and the median over rounds of its time
over vitbench's in the same round (above 1: vitbench is faster). Every model is timed in one
process, interleaved (one forward of each per round, in turn, many rounds; the median per
model), so that machine noise falls on all alike. Each model is built ``--copies`` times, copy
by copy, and a round's time is the mean over its copies: where a model's weights happen to lie
in memory moves its time by up to 3 % on a small VM. fp32, random weights and images (speed
does not depend on them). Methods: ``name:key=value,...`` separated by commas (or ``;`` as in
gpu_reduction.py).
"""
from __future__ import annotations

import argparse
import copy
import re
import shlex
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd
import timm
import torch

import vitbench
from vitbench.engine import cpu_kernels
from vitbench.host.allocator import keep_freed_memory
from vitbench.host.environment import device_name
from vitbench.measure import count_gmacs
from vitbench.measure.compiled import compile_for_timing
from vitbench.measure.limit import TokenCountLimit, token_counts
from vitbench.measure.speed import machine_load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_reduction import _split_top_level, official_tome, parse_methods  # noqa: E402  (the sibling benchmark's)

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
    ``tome official``), a row stub per method, and notes; each model in ``--copies`` copies
    (``name#i``), built copy by copy, so that each copy's weights lie elsewhere in memory."""
    models: dict[str, torch.nn.Module] = {}
    rows: list[dict[str, Any]] = [{"method": "baseline", "GMACs": count_gmacs(base, images).mean}]
    notes: list[str] = []
    for i in range(args.copies):
        own = base if i == 0 else copy.deepcopy(base)
        models[f"baseline#{i}"] = own
        for name, params in split_methods(args.methods):
            method = vitbench.apply(copy.deepcopy(own), name, **params).eval()
            models[f"{name} limit#{i}"] = TokenCountLimit(own, token_counts(method, images))
            models[f"{name} vitbench#{i}"] = method
            if i == 0:
                rows.append({"method": name + "".join(f" {k}={v}" for k, v in params.items()),
                             "key": name, "GMACs": count_gmacs(method, images).mean})
            if args.reference and name == "tome":
                r = str(params.get("r", 16))
                if not r.isdigit():
                    if i == 0:
                        notes.append(f"official ToMe left out: r={r} is not one integer")
                    continue
                official = official_tome(own, args.reference, int(r))
                if i == 0:
                    with torch.inference_mode():
                        diff = (official(images) - method(images)).abs().max().item()
                    notes.append(f"max |vitbench ToMe - official ToMe| logits (fp32): {diff:.2e}")
                models[f"tome official#{i}"] = official
    return models, rows, notes


def _per_model(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per round, each model's mean time over its copies (``name#i`` -> ``name``)."""
    copies: dict[str, list[list[float]]] = {}
    for key, values in times.items():
        copies.setdefault(key.rsplit("#", 1)[0], []).append(values)
    return {name: [statistics.fmean(round_) for round_ in zip(*runs)] for name, runs in copies.items()}


class OwnCache(torch.nn.Module):
    """``model`` behind a forward whose code object is its own, so that compiled it has a dynamo
    cache of its own. Dynamo keeps one cache per code object, checks its entries in turn and
    moves the one that matched to the front: models of one class (timm's VisionTransformer is
    the baseline and every reduced model) called in turn would each first fail the guards of
    all the others, every call -- a cost a process that runs one model does not pay."""

    def __init__(self, model: torch.nn.Module, name: str) -> None:
        super().__init__()
        self.model = model
        code = OwnCache._forward.__code__.replace(co_name="forward_" + re.sub(r"\W", "_", name))
        self.forward = types.MethodType(types.FunctionType(code, globals(), code.co_name), self)

    def _forward(self, images: torch.Tensor) -> Any:
        return self.model(images)


def _compiled(models: dict[str, torch.nn.Module], images: torch.Tensor, notes: list[str]
              ) -> dict[str, torch.nn.Module]:
    out = {}
    for name, model in models.items():
        result = compile_for_timing(OwnCache(model, name), tuple(images.shape[1:]), (images.shape[0],), "cpu")
        if result.compiled:
            label, _, i = name.rpartition("#")
            out[f"{label} compiled#{i}"] = result.module
        elif name.endswith("#0"):  # said once, not per copy
            notes.append(f"{name[:-2]}: {result.fallback}; left out of the compiled rows")
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
    parser.add_argument("--copies", type=int, default=3,
                        help="independently built copies of each model, timed in turn (mean per round)")
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
    allocator = keep_freed_memory()  # as `vitbench run` runs
    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False).eval()
    size = tuple(base.pretrained_cfg.get("input_size", (3, 224, 224)))
    images = torch.randn(args.batch, *size)

    models, rows, notes = _build(args, base, images)
    variants = ["eager"] if args.no_compile else ["eager", "compiled"]
    if not args.no_compile:
        models.update(_compiled(models, images, notes))
    load_before = machine_load().load_1min
    times = _per_model(interleaved_ms(models, images, args.rounds, args.warmup))
    load_after = machine_load().load_1min
    df = _table(rows, times, variants)

    print(f"python benchmarks/cpu_batch1.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{args.model}, batch {args.batch}, fp32, {device_name('cpu')}, torch.get_num_threads() "
          f"{torch.get_num_threads()}, torch {torch.__version__}, timm {timm.__version__}; "
          f"{args.rounds} interleaved rounds (median), {args.copies} copies of each model (mean); "
          f"baseline {rows[0]['GMACs']:.2f} GMACs; "
          f"load average {_load(load_before)} before, {_load(load_after)} after; "
          f"CPU kernels: {cpu_kernels.describe()}; allocator: {allocator}")
    print(df.to_markdown(index=False, floatfmt=".3g"))
    for note in notes:
        print(note)
    return df


if __name__ == "__main__":
    main()
