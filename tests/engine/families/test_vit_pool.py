"""The ViT adapter's pooling of a reduced sequence (plugins/vit_family/adapter.py,
``_SizeWeightedPool``): averages weighted by token size, maxima over real tokens only."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import timm
import torch

from vitbench_plugins.vit_family.adapter import _SizeWeightedPool


def _pool(global_pool: str, size: torch.Tensor) -> _SizeWeightedPool:
    model = timm.create_model("test_vit", pretrained=False, global_pool=global_pool)
    return _SizeWeightedPool(model, SimpleNamespace(state=SimpleNamespace(size=size)))


@pytest.mark.parametrize("pool_type", ["max", "avgmax"])
def test_max_pooling_skips_padded_slots(pool_type):
    """A padded slot (size 0) holds a value larger than every real token's: it must not win the
    max (it did for ``max``, which went to timm's own pool, and for ``avgmax``)."""
    torch.manual_seed(0)
    x = -1.0 - torch.rand(2, 5, 8)  # prefix + 4 patch tokens, every real feature negative
    size = torch.tensor([[1.0, 1, 2, 1, 1], [1.0, 3, 1, 0, 0]]).unsqueeze(-1)  # image 1: two padded slots
    x[1, 3:] = 0.0  # what a padded slot holds
    out = _pool(pool_type, size)(x)
    real = [x[0, 1:], x[1, 1:3]]
    for i, tokens in enumerate(real):
        peak = tokens.amax(dim=0)
        weights = size[i, 1 : 1 + len(tokens)]
        avg = (tokens * weights).sum(dim=0) / weights.sum()
        expected = peak if pool_type == "max" else 0.5 * (peak + avg)
        torch.testing.assert_close(out[i], expected, rtol=0, atol=1e-6)
    assert (out[1] < 0).all()


@pytest.mark.parametrize("pool_type", ["avg", "max", "avgmax"])
def test_without_padding_the_pool_equals_timms_on_unit_sizes(pool_type):
    x = torch.randn(2, 5, 8)
    pool = _pool(pool_type, torch.ones(2, 5, 1))
    torch.testing.assert_close(pool(x), pool._pool(x, pool_type=pool_type), rtol=0, atol=1e-6)
