"""Issue #2, item 10: vitbench's ToMe on DeiT-S, r=13, fp32 — efficiency and exactness.

    python benchmarks/tome_efficiency.py [--batch-size 32] [--repeats 10] [--device cpu]

Prints GMACs of baseline and ToMe, median throughput of each (same process, same kernel
settings), speed-up, efficiency (= speed-up / GMACs ratio; official ToMe reaches 0.99 on this
CPU), and the max difference of ToMe's logits from the independent unfused reference
(vitbench.testing.reference_tome) on the same weights and images.
"""
from __future__ import annotations

import argparse
import copy

import timm
import torch

import vitbench
from vitbench.measure import count_gmacs_at, efficiency, measure_throughput, speedup
from vitbench.testing.reference_tome import reference_tome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--r", type=int, default=13)
    args = parser.parse_args()

    torch.manual_seed(0)
    base = timm.create_model("deit_small_patch16_224", pretrained=False).eval()
    tome = vitbench.apply(copy.deepcopy(base), "tome", r=args.r)

    images = torch.randn(4, 3, 224, 224)
    with torch.inference_mode():
        ours = tome(images)
    ref = reference_tome(base, images, [args.r] * len(base.blocks))
    diff = (ours - ref).abs().max().item()

    g_base, g_tome = count_gmacs_at(base).mean, count_gmacs_at(tome).mean
    base.to(args.device)
    tome.to(args.device)
    t_base = measure_throughput(base, args.batch_size, device=args.device, repeats=args.repeats)
    t_tome = measure_throughput(tome, args.batch_size, device=args.device, repeats=args.repeats)
    # measure the baseline a second time after ToMe, to show drift of the machine
    t_base2 = measure_throughput(base, args.batch_size, device=args.device, repeats=args.repeats)
    sp = speedup(t_tome.median_img_s, max(t_base.median_img_s, t_base2.median_img_s))
    print(f"device={args.device} threads={torch.get_num_threads()} batch={args.batch_size} fp32")
    print(f"GMACs: baseline {g_base:.3f}  tome r={args.r} {g_tome:.3f}  ratio {g_base / g_tome:.3f}")
    print(f"throughput img/s: baseline {t_base.median_img_s:.2f} (±{t_base.spread_img_s:.2f}), "
          f"again {t_base2.median_img_s:.2f}; tome {t_tome.median_img_s:.2f} (±{t_tome.spread_img_s:.2f})")
    print(f"speed-up {sp:.3f}x (against the faster baseline measurement)  "
          f"efficiency {efficiency(sp, g_base, g_tome):.3f}")
    print(f"max |tome - unfused reference| over 4 images: {diff:.2e}")


if __name__ == "__main__":
    main()
