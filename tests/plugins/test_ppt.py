"""PPT (docs/methods.md §3) and the methods ``entropy``/``average`` built on it."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.testing import tiny_vit


@pytest.mark.parametrize("method", ["ppt", "entropy", "average"])
def test_deit_small_oracle_197_147_97_49(deit_small, method):
    reduced = vitbench.apply(copy.deepcopy(deit_small), method)
    with torch.inference_mode():
        reduced(torch.randn(2, 3, 224, 224))
    counts = reduction_context(reduced).token_counts
    assert counts[3] == 147 and counts[6] == 97 and counts[9] == 49  # last step capped at 48
    assert counts == [197] * 3 + [147] * 3 + [97] * 3 + [49] * 3


def _branches(threshold):
    """Run PPT once; return the final sizes (merged tokens stand for >1 patch only when pooling)."""
    model = vitbench.apply(tiny_vit(), "ppt", r=16, layers=(2,), threshold=threshold)
    with torch.inference_mode():
        model(torch.randn(3, 3, 32, 32))
    return reduction_context(model).state.size


def test_low_variance_pools_and_high_variance_prunes():
    pooled = _branches(threshold=1.0)  # every image's variance is below 1: pool (merge)
    assert pooled[:, 1:].sum(dim=1).flatten().tolist() == [64.0, 64.0, 64.0]
    pruned = _branches(threshold=0.0)  # no variance is below 0: prune, sizes stay 1
    assert pruned is None or torch.equal(pruned, torch.ones_like(pruned))


def test_mixed_batch_picks_the_branch_per_image(monkeypatch):
    import vitbench_plugins.ppt as ppt

    real_var = torch.Tensor.var

    def var_first_image_low(self, *args, **kwargs):  # image 0 pools, images 1.. prune
        out = real_var(self, *args, **kwargs)
        return torch.where(torch.arange(out.shape[0]) == 0, torch.zeros_like(out), torch.ones_like(out))

    monkeypatch.setattr(torch.Tensor, "var", var_first_image_low)
    model = vitbench.apply(tiny_vit(), "ppt", r=16, layers=(2,), threshold=0.5)
    with torch.inference_mode():
        model(torch.randn(3, 3, 32, 32))
    size = reduction_context(model).state.size
    assert ppt is not None
    assert size[0, 1:].sum().item() == 64.0  # pooled: 48 tokens stand for all 64 patches
    assert size[1:, 1:].sum(dim=1).flatten().tolist() == [48.0, 48.0]  # pruned: 16 patches dropped


@pytest.mark.parametrize("bad, message", [
    (dict(layers=(3, 99)), r"ppt.layers contains 99; valid block indices for this model: 0..11"),
    (dict(r=-1), r"ppt.r=-1 is out of range"),
    (dict(score="nope"), r"unknown scorer 'nope'; valid scorers: average, cls-attn, entropy"),
])
def test_bad_parameters(bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "ppt", **bad)


def test_only_listed_blocks_need_attention_probabilities():
    model = vitbench.apply(tiny_vit(), "entropy")
    fused = [blk.fused for blk in model.blocks]
    assert [i for i, f in enumerate(fused) if not f] == [3, 6, 9]
    cls_model = vitbench.apply(tiny_vit(), "ppt")  # cls row only: fused kernel kept everywhere
    assert all(blk.fused for blk in cls_model.blocks)
