"""Features of a block's or stage's output per image (vitbench/engine/features.py)."""
from __future__ import annotations

import torch

from vitbench.engine.features import module_features, pooled_features, token_features
from vitbench.testing import tiny_vit


def test_pooled_features_of_tokens_hybrid_sequences_and_maps():
    g = torch.Generator().manual_seed(0)
    tokens, size = torch.randn(2, 5, 3, generator=g), torch.rand(2, 5, 1, generator=g) + 0.5
    assert torch.equal(pooled_features(tokens, 1, size), token_features(tokens, 1, size))
    sequences = torch.randn(8, 6, 3, generator=g)  # 2 images x 4 sequences, image-major, no prefix
    assert torch.allclose(pooled_features(sequences, batch=2), sequences.reshape(2, 24, 3).mean(dim=1))
    nchw = torch.randn(2, 3, 4, 5, generator=g)
    assert torch.equal(pooled_features(nchw), nchw.mean(dim=(2, 3)))
    assert torch.equal(pooled_features(nchw.permute(0, 2, 3, 1), channels_last=True), nchw.mean(dim=(2, 3)))


def test_module_features_pool_what_a_module_outputs_during_the_forward():
    model = tiny_vit(depth=2)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
        tokens = model.blocks[1](model.blocks[0](x))
        features = module_features(model, model.blocks[-1], images)
    torch.testing.assert_close(features, tokens[:, 1:].mean(dim=1))
