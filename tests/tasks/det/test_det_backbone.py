"""FeatureMaps, the det/seg backbone wrapper: stage maps of hybrids (hooks, nominal sizes after a
method shrinks them), the unmerged token map + simple pyramid of plain ViTs, and clear errors."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import UnsupportedError
from vitbench.tasks.dense.backbone import FeatureMaps, SimplePyramid, is_plain_vit, out_channels_of

HYBRIDS = ("mobilevit_xs", "efficientvit_b1")
STRIDES = ((16, 32), (4, 8, 16, 32))
VIT_STRIDES = (4, 8, 16, 32)


def _vit(backbone_factory, **kwargs) -> nn.Module:
    """A 4-block ViT-Ti at 64x64 (a 4x4 patch grid), random weights."""
    return backbone_factory("vit_tiny_patch16_224", depth=4, **kwargs)


def _positions(fmap: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, H*W, C]``: the vector at each map position."""
    return fmap.flatten(2).transpose(1, 2)


@pytest.mark.parametrize("name", HYBRIDS)
@pytest.mark.parametrize("strides", STRIDES)
@pytest.mark.parametrize("size", [(64, 64), (80, 48)])
def test_hybrid_maps_have_the_stage_channels_and_ceil_sizes(backbone_factory, name, strides, size):
    model = backbone_factory(name)
    fm = FeatureMaps(model, strides)
    assert fm.pyramid is None and not is_plain_vit(model)
    channels = out_channels_of(model, strides)
    assert fm.out_channels == channels and len(channels) == len(strides)
    h, w = size
    with torch.no_grad():
        maps = fm(torch.randn(2, 3, h, w))
    assert isinstance(maps, tuple)
    assert [tuple(m.shape) for m in maps] == [(2, c, math.ceil(h / s), math.ceil(w / s))
                                              for c, s in zip(channels, strides)]
    assert fm._maps == {}  # nothing kept between forwards


def test_out_channels_follow_timm_feature_info(backbone_factory):
    mobilevit, efficientvit = backbone_factory("mobilevit_xs"), backbone_factory("efficientvit_b1")
    assert out_channels_of(mobilevit, (4, 8, 16, 32)) == [48, 64, 80, 384]  # stride 32: final_conv
    assert out_channels_of(efficientvit, (4, 8, 16, 32)) == [32, 64, 128, 256]
    assert out_channels_of(efficientvit, (32, 16)) == [256, 128]  # in the order asked


@pytest.mark.parametrize("name", HYBRIDS)
def test_unpatched_maps_equal_the_timm_stage_outputs(backbone_factory, name):
    model = backbone_factory(name)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        reference = model.forward_intermediates(x, intermediates_only=True)
    by_stride = {int(info["reduction"]): out for info, out in zip(model.feature_info, reference)}
    fm = FeatureMaps(model, (4, 8, 16, 32))
    with torch.no_grad():
        maps = fm(x)
    for stride, fmap in zip((4, 8, 16, 32), maps):
        assert torch.equal(fmap, by_stride[stride]), stride


@pytest.mark.parametrize("name, s16_module, s32_module, channels", [
    ("mobilevit_xs", "stages.3", "final_conv", (80, 384)), ("efficientvit_b1", "stages.2", "stages.3", (128, 256))])
def test_ltm_shrunk_maps_are_resized_back_to_the_nominal_size(backbone_factory, name, s16_module, s32_module,
                                                              channels):
    base = backbone_factory(name)
    model = vitbench.apply(copy.deepcopy(base), "ltm", ratio=0.5)
    inner = {}
    for module_name in (s16_module, s32_module):
        model.get_submodule(module_name).register_forward_hook(
            lambda m, a, out, key=module_name: inner.__setitem__(key, out))
    fm = FeatureMaps(model, (16, 32))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        s16, s32 = fm(x)
    assert tuple(inner[s16_module].shape[-2:]) == (3, 3)  # LTM merged the 4x4 grid to 3x3
    assert tuple(s16.shape) == (2, channels[0], 4, 4) and tuple(s32.shape) == (2, channels[1], 2, 2)
    expected = F.interpolate(inner[s16_module], size=(4, 4), mode="bilinear", align_corners=False)
    assert torch.equal(s16, expected)
    assert torch.equal(s32, inner[s32_module])  # already nominal: passed through as it is
    assert fm.resized == {16: ((3, 3), (4, 4))}  # what the record's resized_maps states
    from vitbench.tasks.dense.run import resized_maps

    assert resized_maps(fm) == {"resized_maps": [{"stride": 16, "size": [3, 3], "nominal": [4, 4]}]}
    unreduced = FeatureMaps(copy.deepcopy(base), (16, 32))
    with torch.no_grad():
        unreduced(x)
    assert unreduced.resized == {} and resized_maps(unreduced) == {}


def test_tome_on_mobilevit_keeps_nominal_maps(backbone_factory):
    model = vitbench.apply(backbone_factory("mobilevit_xs"), "tome", r=2)
    with torch.no_grad():
        fm = FeatureMaps(model, (4, 8, 16, 32))
        maps = fm(torch.randn(1, 3, 64, 64))
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert fm.resized == {}


def test_init_weights_keeps_the_timm_weights(backbone_factory):
    for model in (backbone_factory("mobilevit_xs"), _vit(backbone_factory)):
        fm = FeatureMaps(model, VIT_STRIDES)
        before = {k: v.clone() for k, v in fm.state_dict().items()}
        fm.init_weights()
        after = fm.state_dict()
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_deepcopy_captures_into_the_copy(backbone_factory):
    fm = FeatureMaps(backbone_factory("mobilevit_xs"), (8, 16, 32))
    twin = copy.deepcopy(fm)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        got, ref = twin(x), fm(x)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


def test_model_without_feature_info_is_unsupported():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2))
    with pytest.raises(UnsupportedError, match="Sequential has no feature_info"):
        FeatureMaps(model, (16, 32))
    with pytest.raises(UnsupportedError, match="no feature_info"):
        out_channels_of(model, (16, 32))


@pytest.mark.parametrize("name, strides, missing, has", [
    ("mobilevit_xs", (16, 64), "[64]", "[2, 4, 8, 16, 32]"),
    ("efficientvit_b1", (2, 4, 64), "[2, 64]", "[4, 8, 16, 32]"),
])
def test_missing_strides_are_named(backbone_factory, name, strides, missing, has):
    model = backbone_factory(name)
    with pytest.raises(UnsupportedError) as err:
        FeatureMaps(model, strides)
    assert f"stride(s) {missing}" in str(err.value) and f"it has: {has}" in str(err.value)
    assert not model._forward_hooks and not any(m._forward_hooks for m in model.modules())


# -- plain ViT: unmerge + simple feature pyramid ---------------------------------------------------

def test_vit_pyramid_shapes(backbone_factory):
    model = _vit(backbone_factory)
    fm = FeatureMaps(model, VIT_STRIDES)
    assert is_plain_vit(model) and isinstance(fm.pyramid, SimplePyramid)
    assert fm.out_channels == out_channels_of(model, VIT_STRIDES) == [192] * 4
    with torch.no_grad():
        maps = fm(torch.randn(2, 3, 64, 64))
    assert [tuple(m.shape) for m in maps] == [(2, 192, 16, 16), (2, 192, 8, 8), (2, 192, 4, 4), (2, 192, 2, 2)]


def test_vit_stride_16_map_is_the_patch_token_grid(backbone_factory):
    model = _vit(backbone_factory)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        tokens = model.forward_features(x)
        (s16,) = FeatureMaps(model, (16,))(x)
    assert torch.equal(_positions(s16), tokens[:, model.num_prefix_tokens:])


def test_vit_tome_map_is_the_unmerged_full_grid(backbone_factory):
    base = _vit(backbone_factory)
    x = torch.randn(2, 3, 64, 64)
    reference = FeatureMaps(copy.deepcopy(base), VIT_STRIDES)
    model = vitbench.apply(copy.deepcopy(base), "tome", r=2)
    fm = FeatureMaps(model, VIT_STRIDES)
    assert reduction_context(model).trace_source  # unmerge needs the sources
    final = {}
    model.norm.register_forward_hook(lambda m, a, out: final.__setitem__("tokens", out))
    with torch.no_grad():
        maps, ref = fm(x), reference(x)
    assert [m.shape for m in maps] == [m.shape for m in ref]
    patches = final["tokens"][:, model.num_prefix_tokens:]
    assert patches.shape[1] < 16  # merged: fewer tokens than the 4x4 grid
    for b in range(2):  # every grid position holds one of the merged tokens, and each token appears
        positions = _positions(maps[2])[b]
        distinct = torch.unique(positions, dim=0)
        assert distinct.shape[0] == patches.shape[1]
        assert all((patches[b] == row).all(dim=1).any() for row in distinct)


def test_vit_algm_map_gives_each_merged_window_one_vector(backbone_factory):
    """ALGM, made for dense tasks: its window merge is unmerged for the head, each 2x2 window
    of the stride-16 map holding the one token it became (threshold -1 merges every window)."""
    model = vitbench.apply(_vit(backbone_factory), "algm", threshold=-1.0, global_threshold=1.0)
    with torch.no_grad():
        (s16,) = FeatureMaps(model, (16,))(torch.randn(2, 3, 64, 64))
    assert reduction_context(model).token_counts == [5, 5, 5, 5]  # class token + 4 windows
    grid = s16.permute(0, 2, 3, 1)  # [B, 4, 4, C]
    for r in (0, 2):
        for c in (0, 2):
            window = grid[:, r:r + 2, c:c + 2].flatten(1, 2)
            assert torch.equal(window, window[:, :1].expand_as(window))
    assert not torch.equal(grid[:, 0, 0], grid[:, 0, 2])


def test_vit_tome_r0_maps_equal_the_unreduced_maps(backbone_factory):
    base = _vit(backbone_factory)
    reference = FeatureMaps(copy.deepcopy(base), VIT_STRIDES)
    fm = FeatureMaps(vitbench.apply(copy.deepcopy(base), "tome", r=0), VIT_STRIDES)
    fm.pyramid.load_state_dict(reference.pyramid.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        maps, ref = fm(x), reference(x)
    assert all(torch.equal(a, b) for a, b in zip(maps, ref))


def test_vit_ltm_map_is_not_constant(backbone_factory):
    model = vitbench.apply(_vit(backbone_factory), "ltm", ratio=0.5)
    with torch.no_grad():
        (s16,) = FeatureMaps(model, (16,))(torch.randn(1, 3, 64, 64))
    assert torch.unique(_positions(s16)[0], dim=0).shape[0] > 1


def test_simple_pyramid_rejects_other_strides(backbone_factory):
    with pytest.raises(UnsupportedError, match="strides 4, 8, 16, 32; got 64"):
        SimplePyramid(192, (16, 64))
    with pytest.raises(UnsupportedError, match="got 2"):
        FeatureMaps(_vit(backbone_factory), (2, 16))


@pytest.mark.parametrize("name, method, params", [("mobilevit_xs", "ltm", {"ratio": 0.5}),
                                                  ("vit_tiny_patch16_224", "tome", {"r": 2})])
def test_forward_remembers_the_input_images(backbone_factory, name, method, params):
    kwargs = {"depth": 4} if name.startswith("vit_") else {}
    model = vitbench.apply(backbone_factory(name, **kwargs), method, **params)
    fm = FeatureMaps(model, (16, 32))
    with torch.no_grad():
        model(torch.randn(4, 3, 64, 64))  # e.g. a statistics pass through the classifier
        x = torch.randn(2, 3, 64, 64)
        fm(x)
    inputs = reduction_context(model).inputs
    assert inputs is not None and inputs.shape == x.shape and torch.equal(inputs, x)


def _small_swin(img_size: int):  # type: ignore[no-untyped-def]
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(img_size=img_size, embed_dim=16, depths=(1, 1, 2, 2), num_heads=(1, 2, 2, 4),
                           window_size=7, num_classes=3).eval()


def test_swin_stages_are_the_pyramid_channels_first():
    """Swin's stages give [B, H, W, C]: the wrapper hands the detector [B, C, H/s, W/s], the very
    stage outputs (permuted); ToMe keeps every map at its size (the MLP's tokens are unmerged)."""
    model = _small_swin(128)
    x = torch.randn(2, 3, 128, 128)
    maps = FeatureMaps(model, (16, 32))
    with torch.inference_mode():
        out = maps(x)
        stage3 = model.layers[:3](model.patch_embed(x))
    assert [tuple(m.shape) for m in out] == [(2, 64, 8, 8), (2, 128, 4, 4)]
    assert torch.equal(out[0], stage3.permute(0, 3, 1, 2))
    reduced = FeatureMaps(vitbench.apply(_small_swin(128), "tome", r=8), (16, 32))
    with torch.inference_mode():
        merged = reduced(x)
    assert [m.shape for m in merged] == [m.shape for m in out]
    assert all(torch.isfinite(m).all() for m in merged) and not torch.equal(merged[0], out[0])
