"""Where ToMe's eager time over its token-count limit goes at batch 1 on a CPU (issue 23, item 5).

    python benchmarks/cpu_tome_overhead.py [--model deit_small_patch16_224] [--r 13] [--threads 2]
        [--rounds 60]

Five models on the same token counts, timed interleaved in one process (one forward of each per
round): the limit (:class:`vitbench.measure.limit.TokenCountLimit`), then vitbench's ToMe with
ever more of its work switched on -- the reducing blocks and the head-averaged keys, with tokens
dropped by slicing (``blocks + keys``); plus proportional attention (``+ prop attn``); plus the
bipartite matching, its result unused (``+ matching``); the whole method (``+ merge``). Each
row is the median over rounds of that model's milliseconds minus the limit's in the same round,
so that machine noise, which drifts over seconds, cancels. fp32, random weights and images.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import timm
import torch

import vitbench
from vitbench.engine import bipartite_soft_matching, cpu_kernels, max_merge
from vitbench.host.environment import device_name
from vitbench.measure.limit import TokenCountLimit, token_counts
from vitbench_plugins.tome.reduction import ToMeReducer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_batch1 import interleaved_ms  # noqa: E402  (the sibling benchmark's timer)


class _SliceReducer(ToMeReducer):
    """ToMe's token counts by slicing; with ``match``, the matching is computed and dropped."""

    def __init__(self, r: int, match: bool) -> None:
        super().__init__(r)
        self.match = match

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        r = min(self.r, max_merge(x.shape[1], state.prefix))
        if r <= 0:
            return x
        if self.match:
            bipartite_soft_matching(info.keys, r, state.prefix)
        state.size = state.sizes(x)[:, : x.shape[1] - r]
        return x[:, : x.shape[1] - r]


def _sliced(base: torch.nn.Module, r: int, match: bool, prop_attn: bool) -> torch.nn.Module:
    model = vitbench.apply(copy.deepcopy(base), "tome", r=r, prop_attn=prop_attn).eval()
    for block in model.blocks:
        block.reducer = _SliceReducer(r, match)
    return model


def overhead_models(base: torch.nn.Module, r: int, images: torch.Tensor) -> dict[str, torch.nn.Module]:
    """The limit, then ToMe with ever more of its work on (module docstring), all on ToMe's token counts."""
    tome = vitbench.apply(copy.deepcopy(base), "tome", r=r).eval()
    return {
        "limit": TokenCountLimit(base, token_counts(tome, images)),
        "blocks + keys": _sliced(base, r, match=False, prop_attn=False),
        "+ prop attn": _sliced(base, r, match=False, prop_attn=True),
        "+ matching": _sliced(base, r, match=True, prop_attn=True),
        "+ merge (ToMe)": tome,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--r", type=int, default=13)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False).eval()
    images = torch.randn(1, *base.pretrained_cfg.get("input_size", (3, 224, 224)))
    models = overhead_models(base, args.r, images)
    times = interleaved_ms(models, images, args.rounds, warmup=3)
    over = {name: statistics.median(t - l for t, l in zip(times[name], times["limit"])) for name in models}
    print(f"python benchmarks/cpu_tome_overhead.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{args.model}, r={args.r}, batch 1, fp32, {device_name('cpu')}, {args.threads} threads, "
          f"{args.rounds} interleaved rounds; limit {statistics.median(times['limit']):.1f} ms (median); "
          f"CPU kernels: {cpu_kernels.describe()}")
    print("| model | ms over the limit (median per round) | step's own ms |")
    print("|---|---:|---:|")
    previous = 0.0
    for name, value in over.items():
        if name != "limit":
            print(f"| {name} | {value:.2f} | {value - previous:.2f} |")
            previous = value
    return over


if __name__ == "__main__":
    main()
