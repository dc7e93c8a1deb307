"""The speed limit of a method's token counts (vitbench/measure/limit.py; issue 11, item 3)."""
from __future__ import annotations

import copy

import pytest
import timm
import torch

import vitbench
from vitbench.errors import ParamError
from vitbench.measure import count_gmacs
from vitbench.measure.limit import TokenCountLimit, token_counts


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model("test_vit", pretrained=False).eval()


def test_all_tokens_kept_is_the_unpatched_model(vit):
    images = torch.randn(2, 3, 160, 160)
    n = vit.patch_embed.num_patches + vit.num_prefix_tokens
    limit = TokenCountLimit(vit, [n] * len(vit.blocks))
    with torch.inference_mode():
        assert torch.equal(limit(images), vit(images))


def test_tome_counts_and_cost(vit):
    """ToMe r=4 on test_vit (100 patches + class token, 6 blocks): 97, 93, ... tokens; the limit
    costs less than ToMe itself (no matching) and more than nothing."""
    images = torch.randn(2, 3, 160, 160)
    tome = vitbench.apply(copy.deepcopy(vit), "tome", r=4)
    counts = token_counts(tome, images)
    n = vit.patch_embed.num_patches + vit.num_prefix_tokens
    assert counts == [n - 4 * (i + 1) for i in range(len(vit.blocks))]
    limit = TokenCountLimit(vit, counts)
    with torch.inference_mode():
        assert limit(images).shape == tome(images).shape == (2, vit.num_classes)
    g_base, g_tome, g_limit = (count_gmacs(m, images).mean for m in (vit, tome, limit))
    assert g_limit < g_tome < g_base


@pytest.mark.parametrize("counts, message", [
    ([10, 9], "one count per block"),
    ([50, 60, 40, 30, 20, 10], "never grow"),
    ([50, 40, 30, 20, 10, 0], "must be >= 1"),
])
def test_bad_counts(vit, counts, message):
    with pytest.raises(ParamError, match=message):
        TokenCountLimit(vit, counts)


def test_token_counts_needs_a_reduced_model(vit):
    with pytest.raises(ParamError, match="reduced with vitbench.apply"):
        token_counts(vit, torch.randn(1, 3, 160, 160))


def test_the_overhead_is_timed_against_the_limit_of_the_methods_own_counts(vit):
    """:func:`vitbench.measure.overhead.measure_overhead`: the limit runs ToMe's counts, and the share
    and milliseconds agree with each other."""
    from vitbench.measure.overhead import has_limit, measure_overhead

    images = torch.randn(2, 3, 160, 160)
    tome = vitbench.apply(copy.deepcopy(vit), "tome", r=4)
    fields = measure_overhead(tome, vit, 2, (3, 160, 160), method_ms=40.0, rounds=3, images=images)
    assert fields["overhead_counts"] == token_counts(tome, images) and fields["overhead_rounds"] == 3
    assert -100.0 < fields["overhead_pct"] < 100.0 and fields["overhead_spread_pct"] >= 0
    assert fields["overhead_ms"] == pytest.approx(fields["overhead_pct"] / 100 * 40.0)
    assert "overhead_flagged" in fields and "overhead_load_before" in fields
    assert has_limit(vit) and not has_limit(torch.nn.Linear(2, 2))
