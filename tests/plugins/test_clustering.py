"""What the clustering merges (dpc-knn, kmedoids, atc) share: ``keep=1`` is the unpatched model, and
the token counts and sizes of ``ceil(keep * N_p)`` clusters (vitbench/kit/clustering.py)."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench

METHODS = ("dpc-knn", "kmedoids", "atc")


@pytest.mark.parametrize("method", METHODS)
def test_keep_one_is_the_unpatched_model(vit, method):
    x = torch.randn(2, 3, 160, 160)
    reduced = vitbench.apply(copy.deepcopy(vit), method, keep=1.0, layers=(1, 3))
    with torch.inference_mode():
        assert torch.equal(reduced(x), vit(x))


@pytest.mark.parametrize("method", METHODS)
def test_token_counts_and_sizes(vit, method):
    """test_vit: 100 patches + class token, 6 blocks; keep 0.5 at blocks 1 and 3: 50, then 25
    patches, whose sizes still add up to the 100 patches."""
    x = torch.randn(2, 3, 160, 160)
    reduced = vitbench.apply(copy.deepcopy(vit), method, keep=0.5, layers=(1, 3))
    with torch.inference_mode():
        out = reduced(x)
    ctx = vitbench.engine.reduction_context(reduced)
    assert ctx.token_counts == [101, 51, 51, 26, 26, 26]
    assert torch.allclose(ctx.state.size[:, 1:].sum(dim=1), torch.full((2, 1), 100.0))
    assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()
