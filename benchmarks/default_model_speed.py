"""Whether fewer tokens mean faster on the embedded default model: speed-up and efficiency per method.

    python benchmarks/default_model_speed.py [--model vitbench-fmnist-deit] [--batch 32] [--threads 2]
        [--rounds 30] [--methods tome@0.820,tome@0.6,ppt@0.8,...] [--ltm ibtm@0.7,ibtm@0.7/ib_step=always]

Each entry of ``--methods`` is ``name@F``: the method's budget knob matched so that its GMACs land
at ``F`` x the baseline's, as ``vitbench run --match-gmacs F`` matches it (the same
:func:`vitbench.measure.calibrate.calibrate`, counted on the same images). ``--ltm NAME@RATIO`` adds LTM
(``ltm`` or its alias ``ibtm``) at that merge ratio (``/key=value`` sets other parameters), at inference with its class statistics in place
(:func:`vitbench.measure.calibrate.prepared_as_trained`), and ToMe matched to LTM's GMACs, so that the two
efficiencies compare at the same compute. Every model is timed in one process, interleaved with
the baseline (one forward of each per round, in turn; the median over rounds), fp32, on the first
``--batch`` Fashion-MNIST test images. Speed-up = the baseline's time / the method's; efficiency =
speed-up x GMACs ratio (1.0: every saved MAC became time). The images are real, since PPT's choice
between pruning and merging depends on them; the weights are the shipped ones.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch

import vitbench
from vitbench.measure.calibrate import GmacsCounter, calibrate, prepared_as_trained
from vitbench.host.allocator import keep_freed_memory
from vitbench.host.environment import device_name
from vitbench.measure import count_gmacs
from vitbench.measure.speed import machine_load
from vitbench.host import get_host
from vitbench.tasks.embedded import DEFAULT_MODEL
from vitbench.tasks.cls.models import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_batch1 import interleaved_ms  # noqa: E402  (the sibling benchmark's timer)

#: the main job's budget (Makefile ``DEMO_MATCH_GMACS``), then the budgets issue 34 names
DEFAULT_METHODS = "tome@0.820,tome@0.6,ppt@0.8,ppt@0.7,ppt@0.6,topk@0.8,topk@0.7,topk@0.6"


def parse_entry(text: str) -> tuple[str, float]:
    """``"tome@0.6"`` -> ``("tome", 0.6)``."""
    name, sep, value = text.strip().partition("@")
    if not sep or not name:
        raise SystemExit(f"default_model_speed: {text!r} is not NAME@VALUE (e.g. tome@0.6)")
    return name, float(value)


def fashion_mnist_batch(model: torch.nn.Module, n: int) -> torch.Tensor:
    """The first ``n`` test images, padded to the model's input and normalised as it expects."""
    from vitbench.data.fashion_mnist import load_fashion_mnist, pad_images
    from vitbench.data.input_config import input_config

    cfg = input_config(model)
    images, _ = load_fashion_mnist("test")
    x = torch.from_numpy(pad_images(images[:n], cfg.input_size[0]).astype("float32") / 255.0)[:, None]
    return (x - cfg.mean[0]) / cfg.std[0]


def build(base: torch.nn.Module, images: torch.Tensor, args: argparse.Namespace
          ) -> tuple[dict[str, torch.nn.Module], list[dict[str, Any]]]:
    """The models to time, baseline first, and a row per model (method, knob, GMACs)."""
    one = images[:4]

    def count(method: Optional[str], params: dict[str, Any]) -> float:
        model = copy.deepcopy(base)
        if method is not None:
            model = prepared_as_trained(vitbench.apply(model, method, **params), one)
        return count_gmacs(model.eval(), one).mean

    counter = GmacsCounter(count)
    info = get_host().family_of(base).describe(base)
    base_gmacs = counter(None, {})
    models: dict[str, torch.nn.Module] = {"baseline": base}
    rows = [{"method": "baseline", "knob": "", "GMACs": base_gmacs}]

    def add(name: str, params: dict[str, Any], label: str) -> float:
        model = prepared_as_trained(vitbench.apply(copy.deepcopy(base), name, **params), one).eval()
        gmacs = counter(name, params)
        models[label] = model
        rows.append({"method": label, "knob": ", ".join(f"{k}={v}" for k, v in params.items()),
                     "GMACs": gmacs})
        return gmacs

    def matched(name: str, fraction: float, label: str) -> None:
        result = calibrate(get_host().method(name), {}, fraction, counter, info)
        add(name, dict(result.params), label)

    for name, fraction in map(parse_entry, args.methods.split(",")):
        matched(name, fraction, f"{name} @{fraction:g}")
    for entry in filter(None, args.ltm.split(",")):
        head, _, extra = entry.partition("/")
        name, ratio = parse_entry(head)
        params = {"ratio": ratio, **dict(kv.split("=", 1) for kv in filter(None, extra.split("/")))}
        label = f"{name} ratio={ratio:g}" + "".join(f", {k}={v}" for k, v in params.items() if k != "ratio")
        gmacs = add(name, params, label)
        matched("tome", gmacs / base_gmacs, f"tome @{label}'s {gmacs / base_gmacs:.3f}")
    return models, rows


def table(rows: list[dict[str, Any]], times: dict[str, list[float]], batch: int) -> pd.DataFrame:
    """Median milliseconds per batch, images per second, speed-up and efficiency per row."""
    base_ms = statistics.median(times["baseline"])
    base_gmacs = rows[0]["GMACs"]
    out = []
    for row in rows:
        ms = statistics.median(times[row["method"]])
        spread = statistics.quantiles(times[row["method"]], n=4)
        ratio = row["GMACs"] / base_gmacs
        speedup = base_ms / ms
        out.append({**row, "GMACs ratio": round(ratio, 3), "ms/batch": round(ms, 1),
                    "IQR ms": f"{spread[0]:.1f}-{spread[2]:.1f}", "img/s": round(batch * 1e3 / ms),
                    "speed-up": round(speedup, 3), "efficiency": round(speedup * ratio, 3)})
    return pd.DataFrame(out).assign(GMACs=lambda d: d["GMACs"].round(4))


def _load(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main(argv: Optional[list[str]] = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="NAME@F entries, comma-separated")
    parser.add_argument("--ltm", default="ibtm@0.7",
                        help="NAME@RATIO[/key=value...] entries, comma-separated (ibtm@0.7/ib_step=always), "
                             "or '' to leave LTM out")
    args = parser.parse_args(argv)
    allocator = keep_freed_memory()  # as `vitbench run` runs
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = load_model(args.model).eval()
    images = fashion_mnist_batch(base, args.batch)
    models, rows = build(base, images, args)
    before = machine_load()
    times = interleaved_ms(models, images, args.rounds, args.warmup)
    after = machine_load()
    frame = table(rows, times, args.batch)
    print(f"# {args.model}, batch {args.batch}, fp32, {args.threads} threads, {args.rounds} rounds "
          f"interleaved; {device_name('cpu')}; load average {_load(before.load_1min)} -> {_load(after.load_1min)}; "
          f"allocator: {allocator}")
    print(frame.to_markdown(index=False))
    entries = len([e for e in args.ltm.split(",") if e])
    for i in range(entries):  # each LTM row and the ToMe row matched to it, last in the table
        ltm, tome = frame.iloc[len(frame) - 2 * (entries - i)], frame.iloc[len(frame) - 2 * (entries - i) + 1]
        print(f"\n{ltm['method']} efficiency / {tome['method']} efficiency: "
              f"{ltm['efficiency'] / tome['efficiency']:.2f}")
    return frame


if __name__ == "__main__":
    main()
