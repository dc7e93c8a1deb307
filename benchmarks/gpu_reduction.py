"""Issue 11, item 3: how much of its possible speed-up each training-free method keeps, per precision.

    python benchmarks/gpu_reduction.py [--model vit_base_patch16_224] [--batch-size 256]
        [--precisions fp32,fp16,bf16] [--methods "tome:r=16;ppt:r=50;topk:keep=0.7"]
        [--compile] [--cuda-graph] [--latency] [--bias-channel auto|always|never] [--repeats 20]
        [--device cuda] [--reference /path/to/ToMe]

In one process, per precision (``torch.autocast``; fp32 with TF32 off on CUDA): the timm
baseline, and for each method its *limit* (the same timm blocks on the method's own token
counts, cut between attention and MLP, tokens dropped by slicing: no scoring, matching or
gathering; :mod:`vitbench.measure.limit`) and vitbench's method. Prints a markdown table:
baseline img/s, the limit's and the method's speed-up over the baseline, and their ratio (the
share of the possible speed-up the implementation keeps; issue 11 asks >= 0.95). ``--compile``
adds the ``torch.compile``d rows; ``--cuda-graph`` adds rows timed on a CUDA graph of each
forward (:mod:`vitbench.measure.cuda_graph`; a forward that cannot be captured says why and is
left out); ``--latency`` adds batch-1 latency; ``--bias-channel`` says how proportional attention
reaches SDPA (:mod:`vitbench.engine.attention`: ``auto`` = as an extra query/key channel on CUDA
in half precision, else as a float mask; run twice to compare). Random weights and
images (speed does not depend on them); ToMe's logits are checked against the independent
reference computation (vitbench.testing.reference_tome) in fp32 and in each half precision.
``--reference PATH`` adds the official ToMe code (a clone of facebookresearch/ToMe, imported from
PATH at run time) as a ``tome official`` row beside ``tome vitbench`` at the same integer ``r``.
A method given twice is labelled by the parameters that differ: ``"tome:r=16;tome:r=16,prop_attn=False"``
times ToMe with and without proportional attention, each against its own limit.
Runs on a CPU too (slowly: use a small model and batch), which is how the tests smoke it.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import timm
import torch

import vitbench
from vitbench.measure import measure_latency, measure_throughput
from vitbench.engine.attention import set_bias_channel
from vitbench.measure.cuda_graph import graph_for_timing
from vitbench.measure.limit import TokenCountLimit, token_counts
from vitbench.measure.precision import autocast, check_precision
from vitbench.testing.reference_tome import reference_tome

DEFAULT_METHODS = "tome:r=16;ppt:r=50;topk:keep=0.7"


def parse_methods(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``"tome:r=16;topk:keep=0.7,layers=(3,6,9)"`` -> ``[("tome", {"r": "16"}), ("topk", {...})]``
    (values as written: ``vitbench.apply`` converts and checks them as ``--param`` does)."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, _, rest = item.partition(":")
        params: dict[str, Any] = {}
        for pair in filter(None, _split_top_level(rest)):
            key, _, value = pair.partition("=")
            params[key.strip()] = value.strip()
        out.append((name.strip(), params))
    return out


def labelled(methods: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any], str]]:
    """Each method with its row label: its name, or where the name comes twice (ToMe with and
    without proportional attention) the name with the parameters that differ, ``tome prop_attn=False``."""
    out = []
    for name, params in methods:
        others = [p for n, p in methods if n == name and p is not params]
        differ = {k: v for k, v in params.items() if any(o.get(k) != v for o in others)}
        shown = " ".join([name, *(f"{k}={v}" for k, v in differ.items())])
        out.append((name, params, shown))
    return out


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses (``keep=0.7,layers=(3,6,9)``)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([" and 1 or (-1 if ch in ")]" else 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


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


def _graphed(model: torch.nn.Module, args: argparse.Namespace, precision: str) -> torch.nn.Module:
    """``model`` captured as a CUDA graph at the benchmark's batch sizes (ValueError when it cannot be)."""
    batches = (args.batch_size, 1) if args.latency else (args.batch_size,)
    graphed = graph_for_timing(model, (3, args.image_size, args.image_size), batches, args.device, precision)
    if not graphed.graphed:
        raise ValueError(graphed.fallback)
    return graphed.module


def _timed(model: torch.nn.Module, args: argparse.Namespace, precision: str, variant: str) -> dict[str, float]:
    size = (3, args.image_size, args.image_size)
    if variant == "compiled":
        model = torch.compile(model)
    elif variant == "cuda graph":
        model = _graphed(model, args, precision)
    tp = measure_throughput(model, args.batch_size, size, device=args.device, repeats=args.repeats,
                            precision=precision)
    out = {"img_s": tp.median_img_s, "spread": tp.spread_img_s}
    if args.latency:
        out["latency_ms"] = measure_latency(model, size, device=args.device, repeats=args.repeats,
                                            precision=precision).median_ms
    return out


def tome_exactness(base: torch.nn.Module, r: int, device: str, precisions: list[str]) -> dict[str, float]:
    """Max |vitbench ToMe - reference ToMe| logits on 4 images, per precision (reference in fp32)."""
    tome = vitbench.apply(copy.deepcopy(base), "tome", r=r).to(device)
    images = torch.randn(4, *base.pretrained_cfg.get("input_size", (3, 224, 224)), device=device)
    ref = reference_tome(base.to(device), images, [r] * len(base.blocks)).float()
    out = {}
    for precision in precisions:
        with torch.inference_mode(), autocast(precision, device):
            out[precision] = (tome(images).float() - ref).abs().max().item()
    return out


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--methods", default=DEFAULT_METHODS)
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile'd models")
    parser.add_argument("--cuda-graph", action="store_true", help="also time CUDA graphs of the forwards")
    parser.add_argument("--latency", action="store_true", help="also time batch-1 latency")
    parser.add_argument("--bias-channel", default="auto", choices=("auto", "always", "never"),
                        help="proportional attention as an extra query/key channel (always), a float mask "
                             "(never), or the default (auto: the channel on CUDA in fp16/bf16)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reference", metavar="PATH", help="a clone of facebookresearch/ToMe: time it too")
    args = parser.parse_args(argv)
    precisions = [check_precision(p.strip()) for p in args.precisions.split(",") if p.strip()]
    old_mode = set_bias_channel(args.bias_channel)
    try:
        return _benchmark(args, precisions)
    finally:
        set_bias_channel(old_mode)


def _benchmark(args: argparse.Namespace, precisions: list[str]) -> pd.DataFrame:
    if args.device.startswith("cuda"):  # fp32 means fp32: no TF32 matmuls behind its back
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False).eval().to(args.device)
    args.image_size = int(base.pretrained_cfg.get("input_size", (3, 224, 224))[-1])
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=args.device)
    rows: list[dict[str, Any]] = []
    variants = ["eager"] + ["compiled"] * args.compile + ["cuda graph"] * args.cuda_graph
    for variant in variants:
        for precision in precisions:
            try:
                b = _timed(base, args, precision, variant)
            except ValueError as exc:  # no CUDA graph here at all (a CPU run): say why, skip the variant
                print(f"baseline, {precision}, {variant}: {exc}")
                continue
            rows.append({"row": "baseline", "precision": precision, "timed": variant, "img/s": b["img_s"],
                         "speed-up": 1.0, **({"latency ms": b["latency_ms"]} if args.latency else {})})
            for name, params, shown in labelled(parse_methods(args.methods)):
                method = vitbench.apply(copy.deepcopy(base), name, **params).to(args.device)
                with autocast(precision, args.device):
                    counts = token_counts(method, images)
                models = [(f"{shown} limit", TokenCountLimit(base, counts)), (f"{shown} vitbench", method)]
                if name == "tome" and shown == name and args.reference and str(params.get("r", "")).isdigit():
                    official = official_tome(base, args.reference, int(params["r"])).to(args.device)
                    models.append(("tome official", official))
                for label, model in models:
                    try:
                        t = _timed(model, args, precision, variant)
                    except ValueError as exc:  # no CUDA graph for this forward: say why, leave it out
                        print(f"{label}, {precision}, {variant}: {exc}")
                        continue
                    rows.append({"row": label, "precision": precision, "timed": variant, "img/s": t["img_s"],
                                 "speed-up": t["img_s"] / b["img_s"],
                                 **({"latency ms": t["latency_ms"]} if args.latency else {})})
                limit = next((row for row in reversed(rows) if row["row"] == f"{shown} limit"
                              and row["precision"] == precision and row["timed"] == variant), None)
                mine = {f"{shown} vitbench"} | ({"tome official"} if shown == name == "tome" else set())
                for row in rows:
                    if limit is not None and row["row"] in mine and row["precision"] == precision \
                            and row["timed"] == variant:
                        row["of limit"] = row["speed-up"] / limit["speed-up"]
    df = pd.DataFrame(rows)
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(f"{args.model}, batch {args.batch_size}, device {device}, torch {torch.__version__}, "
          f"timm {timm.__version__}, threads {torch.get_num_threads()}, {args.repeats} repeats, "
          f"bias channel {args.bias_channel}")
    print(df.to_markdown(index=False, floatfmt=".3g"))
    r = next((int(p.get("r", 16)) for n, p in parse_methods(args.methods) if n == "tome"), None)
    if r is not None:
        diffs = tome_exactness(base, r, args.device, precisions)
        print("max |vitbench ToMe - reference ToMe (fp32)| logits: "
              + ", ".join(f"{p} {d:.2e}" for p, d in diffs.items()))
        if args.reference:
            official = official_tome(base, args.reference, r)
            tome = vitbench.apply(copy.deepcopy(base), "tome", r=r).to(args.device)
            with torch.inference_mode():
                diff = (official(images[:4]) - tome(images[:4])).abs().max().item()
            print(f"max |vitbench ToMe - official ToMe| logits (fp32): {diff:.2e}")
    return df


if __name__ == "__main__":
    main()
