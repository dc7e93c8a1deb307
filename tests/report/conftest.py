"""Hand-made run records: a cls group (baseline, tome, an ibtm retried after an error, a failed
ppt, a skipped topk) and a det group, with numbers chosen so every delta is known by hand (the
baseline and tome of 1000 classes, so that their top-5 is shown)."""
from __future__ import annotations

import pytest

ENV = {
    "versions": {"torch": "2.4.1", "timm": "1.0.9", "mmengine": "0.10.5", "mmcv": "2.1.0",
                 "mmdet": "3.3.0", "mmpretrain": "1.2.0", "vitbench": "0.1.0"},
    "device": "cpu (Intel Xeon)", "threads": 2, "precision": "fp32", "git_rev": "3af5c5a",
    "plugins": [{"name": "tome", "version": "0.1.0"}, {"name": "ibtm", "version": "0.1.0"}],
    "command": "vitbench run --methods ibtm,tome,ppt,topk --task cls",
}


def make(spec_id, method, params=None, status="ok", task="cls", model="vitbench-fmnist-vit",
         **metrics):
    return {
        "spec_id": spec_id, "task": task, "model": model,
        "data": "fashion-mnist" if task == "cls" else "shapes-coco",
        "method": method, "params": params or {}, "seed": 0, "status": status,
        "error": metrics.pop("error", None), "num_classes": 10 if task == "cls" else None,
        "attention_kernel": metrics.pop("attention_kernel", "fused (SDPA)"),
        "env": ENV, "started_at": "2024-05-01T10:00:00", "finished_at": "2024-05-01T10:01:00",
        "wall_s": 60.0, **metrics,
    }


@pytest.fixture
def make_record():
    """``make_record(spec_id, method, params, status=..., task=..., **metrics)``."""
    return make


@pytest.fixture
def records():
    return [
        make("s-base", "baseline", top1_pct=81.20, top5_pct=98.50, gmacs=4.60, gmacs_std=0.0, num_classes=1000,
             params_m=22.05, throughput_img_s=100.0, throughput_spread_img_s=2.0, batch_size=64,
             latency_ms=10.0, speedup=1.0),
        make("s-tome", "tome", {"r": 13}, top1_pct=80.68, top5_pct=98.10, gmacs=2.706, num_classes=1000,
             gmacs_std=0.0, params_m=22.05, throughput_img_s=162.0, batch_size=64,
             latency_ms=6.5),
        make("s-ibtm", "ibtm", {"r": 0.7}, status="error", error="first try failed"),
        make("s-ppt", "ppt", {"r": 0.5, "threshold": 7.0}, status="error",
             error="RuntimeError: shapes [1, 197] and [1, 96] differ\n  in block 4"),
        make("s-topk", "topk", {"keep": 0.7}, status="skipped",
             error="needs attention probabilities the family does not expose"),
        make("s-ibtm", "ibtm", {"r": 0.7}, top1_pct=81.50, gmacs=3.10, gmacs_std=0.03,
             params_m=22.10, ib_loss=0.1234, ib_bound=0.5678, speedup=1.41, efficiency=0.95,
             attention_kernel="unfused in blocks 3,6,9"),
        make("d-base", "baseline", task="det", model="deit_small_patch16_224", box_map=0.301,
             gmacs=9.5, throughput_img_s=20.0, batch_size=8),
        make("d-tome", "tome", {"r": 8}, task="det", model="deit_small_patch16_224",
             box_map=0.290, gmacs=7.0, throughput_img_s=25.0, batch_size=8),
    ]
