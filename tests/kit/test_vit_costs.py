"""Per-block MAC coefficients of a plain ViT (vitbench/kit/vit_costs.py) against the counter."""
from __future__ import annotations

import torch

from vitbench.kit import vit_block_costs
from vitbench.measure import count_gmacs
from vitbench.testing import tiny_vit


def test_the_blocks_terms_are_what_the_counter_counts_beyond_embedding_and_head():
    model = tiny_vit()
    costs = vit_block_costs(model, model.embed_dim)
    n = 65  # class token + 64 patches
    conv = model.patch_embed.proj
    embedding = 64 * conv.out_channels * conv.in_channels * 4 * 4
    head = model.head.in_features * model.head.out_features
    blocks = sum(a * n + b * n * n + c * n for a, b, c in zip(costs.linear, costs.quadratic, costs.mlp))
    counted = count_gmacs(model, torch.zeros(1, 3, 32, 32)).mean * 1e9
    assert round(counted) == embedding + head + blocks
    assert costs.head_dim == (model.embed_dim // model.blocks[0].attn.num_heads,) * 12
