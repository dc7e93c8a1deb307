"""Top-k pruning and EViT's fused token (docs/methods.md §4)."""
from __future__ import annotations

import math

import torch

import vitbench
from vitbench.engine import reduction_context
from vitbench.testing import tiny_vit


def _run(**params):
    model = vitbench.apply(tiny_vit(), "topk", **params)
    with torch.inference_mode():
        model(torch.randn(2, 3, 32, 32))
    return reduction_context(model)


def test_keeps_ceil_keep_times_patches_at_listed_blocks():
    counts = _run(keep=0.7).token_counts
    k1 = math.ceil(0.7 * 64)
    k2 = math.ceil(0.7 * k1)
    k3 = math.ceil(0.7 * k2)
    assert counts == [65] * 3 + [1 + k1] * 3 + [1 + k2] * 3 + [1 + k3] * 3


def test_fuse_adds_one_token_standing_for_the_dropped_patches():
    context = _run(keep=0.5, layers=(1,), fuse=True)
    assert context.token_counts == [65] + [1 + 32 + 1] * 11
    size = context.state.size
    assert size[:, -1].flatten().tolist() == [32.0, 32.0]  # the fused token
    assert size[:, 1:].sum(1).flatten().tolist() == [64.0, 64.0]
