"""ToMe (docs/methods.md §1): token-count oracles, equality with the unpatched model at r=0,
equality with an independent unfused reference, schedules, and bad parameters."""
from __future__ import annotations

import copy

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.kit import schedule

from vitbench.testing.reference_tome import reference_tome


def _counts(model, method, images, **params):
    reduced = vitbench.apply(copy.deepcopy(model), method, **params)
    with torch.inference_mode():
        reduced(images)
    return reduction_context(reduced).token_counts


def test_r16_token_counts_on_deit_small(deit_small):
    counts = _counts(deit_small, "tome", torch.randn(1, 3, 224, 224), r=16)
    assert counts == [181, 165, 149, 133, 117, 101, 85, 69, 53, 37, 21, 11]


def test_r13_ends_at_41_tokens(deit_small):
    counts = _counts(deit_small, "tome", torch.randn(1, 3, 224, 224), r=13)
    assert counts[-1] == 41
    assert counts == [197 - 13 * (i + 1) for i in range(12)]


SMALL_VARIANTS = {
    "cls": dict(),
    "layerscale-qknorm": dict(init_values=1e-1, qk_norm=True),
    "registers-avgpool": dict(reg_tokens=4, global_pool="avg"),
    "no-cls-avgpool": dict(class_token=False, global_pool="avg"),
}


def _small_vit(**kw):
    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=3, num_classes=10)
    args.update(kw)
    return VisionTransformer(**args).eval()


@pytest.mark.parametrize("variant", sorted(SMALL_VARIANTS))
def test_r0_equals_the_unpatched_model(variant):
    model = _small_vit(**SMALL_VARIANTS[variant])
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
        got = vitbench.apply(copy.deepcopy(model), "tome", r=0)(x)
    assert (got - expected).abs().max() < 1e-5


def test_r0_equals_unpatched_deit_small_fused_and_unfused(deit_small):
    x = torch.randn(2, 3, 224, 224)
    for fused in (True, False):
        model = copy.deepcopy(deit_small)
        for blk in model.blocks:
            blk.attn.fused_attn = fused
        with torch.inference_mode():
            expected = model(x)
            got = vitbench.apply(model, "tome", r=0)(x)
        assert (got - expected).abs().max() < 1e-5


def test_distilled_deit_keeps_both_prefix_tokens():
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(0)
    model = VisionTransformerDistilled(img_size=32, patch_size=4, embed_dim=48, depth=4,
                                       num_heads=3, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
        assert (vitbench.apply(copy.deepcopy(model), "tome", r=0)(x) - expected).abs().max() < 1e-5
        reduced = vitbench.apply(copy.deepcopy(model), "tome", r=8)
        feats = reduced.forward_features(x)
        base = model.forward_features(x)
    # cls and dist tokens never merge: prefix tokens stay first, merged only by attention
    assert reduction_context(reduced).token_counts == [58, 50, 42, 34]
    state = reduction_context(reduced).state
    assert torch.equal(state.size[:, :2], torch.ones(2, 2, 1))
    assert feats.shape[1] == 34 and base.shape[1] == 66


@pytest.mark.parametrize("variant", sorted(SMALL_VARIANTS))
def test_matches_unfused_reference_implementation(variant):
    model = _small_vit(**SMALL_VARIANTS[variant])
    x = torch.randn(3, 3, 32, 32)
    r = [6, 6, 5, 4]
    with torch.inference_mode():
        got = vitbench.apply(copy.deepcopy(model), "tome", r=r)(x)
    expected = reference_tome(model, x, r)
    assert (got - expected).abs().max() < 1e-4


def test_fused_and_unfused_kernels_agree(deit_small):
    x = torch.randn(2, 3, 224, 224)
    outs = []
    for fused in (True, False):
        model = copy.deepcopy(deit_small)
        for blk in model.blocks:
            blk.attn.fused_attn = fused
        with torch.inference_mode():
            outs.append(vitbench.apply(model, "tome", r=13)(x))
    assert (outs[0] - outs[1]).abs().max() < 1e-4


def test_inflect_schedule_is_linear():
    assert schedule((10, -0.5), 4) == [15, 11, 8, 5]  # from r*(1-inflect)=15 to 2r-15=5
    assert schedule(7, 3) == [7, 7, 7]
    with pytest.raises(ParamError, match="has 2 entries; the model has 12 blocks"):
        vitbench.apply(_small_vit(depth=12), "tome", r=[1, 2])


@pytest.mark.parametrize("bad, message", [
    (dict(r=-3), r"tome.r=-3 is out of range"),
    (dict(r="many"), r"tome.r='many' is not a valid"),
    (dict(q=1), r"unknown parameter tome.q; valid parameters of tome: r, prop_attn, trace_source"),
])
def test_bad_parameters_name_the_value(bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(_small_vit(), "tome", **bad)


def test_gradients_flow_through_the_merge():
    model = vitbench.apply(_small_vit(), "tome", r=8).train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.blocks[0].block.attn.qkv.weight.grad is not None
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0


def test_a_sequence_too_short_to_merge_is_left_alone():
    """Hybrids run ToMe on short sequences (MobileViT: 1 token at 64x64): r caps to 0."""
    from vitbench.engine import AttnInfo, TokenState
    from vitbench_plugins.tome.reduction import ToMeReducer

    x = torch.randn(4, 1, 8)
    state = TokenState.start(x, prefix=0)
    assert ToMeReducer(2)(x, state, AttnInfo(keys=torch.randn(4, 1, 8))) is x
    assert state.size is None
