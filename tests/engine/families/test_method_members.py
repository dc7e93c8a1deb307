"""What the family adapters offer methods (``FamilySpec``'s optional members): merge grids,
tiles, sequence grids, the feature module and final features, the channel reducer."""
from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
from timm.models.swin_transformer import SwinTransformer

from vitbench.engine.grid_merge import scaled_merge_grid, square_merge_grid
from vitbench_plugins.efficientvit_family import adapter as efficientvit
from vitbench_plugins.mobilevit_family import adapter as mobilevit
from vitbench_plugins.vit_family import adapter as vit
from vitbench.errors import UnsupportedError
from vitbench.measure.ib import final_features, token_features
from vitbench.host import get_host
from vitbench.testing import tiny_vit


def _family(name: str):  # type: ignore[no-untyped-def]
    """The registered family adapter (its references imported)."""
    return get_host().family(name)


def _swin() -> SwinTransformer:
    torch.manual_seed(0)
    return SwinTransformer(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                           num_classes=3).eval()


def test_each_family_declares_what_it_offers():
    families = {name: get_host().family(name) for name in ("vit", "swin", "mobilevit", "efficientvit")}
    assert {n for n, f in families.items() if f.merge_grid} == {"vit", "swin", "mobilevit", "efficientvit"}
    assert [n for n, f in families.items() if f.reduces_tiles] == ["swin"]
    assert [n for n, f in families.items() if f.sequence_grids] == ["mobilevit", "efficientvit"]
    assert [n for n, f in families.items() if f.channels_last] == ["swin"]
    assert [n for n, f in families.items() if f.channel_reducer] == ["efficientvit"]
    assert all(f.feature_module is not None for f in families.values())


@pytest.mark.parametrize("ratio, patches, expected", [
    (0.7, 64, (45, (7, 7))), (1.0, 64, (64, (8, 8))), (0.7, 10, (7, (3, 3))), (0.001, 64, (1, (1, 1))),
])
def test_vit_merge_grid_keeps_ceil_ratio_n_tokens_on_a_square_grid(ratio, patches, expected):
    info = vit.describe(tiny_vit())
    info = type(info)(**{**info.__dict__, "num_patches": patches})
    assert square_merge_grid(info, ratio) == expected
    assert _family("swin").merge_grid is square_merge_grid  # a Swin tile merges as a short ViT sequence


def test_mobilevit_merge_grid_scales_each_side_and_chains_the_sequences():
    model = timm.create_model("mobilevit_xs", pretrained=False).eval()
    model.vitbench_input_size = (256, 256)
    info = mobilevit.describe(model)
    assert scaled_merge_grid(info, 0.7) == (196, (14, 14))  # ceil(16 * sqrt(0.7)) = 14
    assert scaled_merge_grid(info, 1.0) == (256, (16, 16))
    plan = _family("mobilevit").sequence_grids(info, lambda s, grid: scaled_merge_grid(
        type(info)(**{**info.__dict__, "grid": grid, "blocks": ()}), 0.7)[1])
    assert plan == [((16, 16), (14, 14)), ((7, 7), (6, 6)), ((3, 3), (3, 3))]


def test_efficientvit_merges_as_mobilevit_and_each_stage_sees_half_the_last_merged_map():
    model = timm.create_model("efficientvit_b1", pretrained=False).eval()
    model.vitbench_input_size = (320, 320)
    info = efficientvit.describe(model)
    assert _family("efficientvit").merge_grid is scaled_merge_grid
    plan = _family("efficientvit").sequence_grids(info, lambda s, grid: scaled_merge_grid(
        type(info)(**{**info.__dict__, "grid": grid, "blocks": ()}), 0.64)[1])
    assert plan == [((20, 20), (16, 16)), ((8, 8), (7, 7))]  # unreduced stage 3: 10x10
    gapped = type(info)(**{**info.__dict__, "blocks": (info.blocks[0], dataclasses.replace(
        info.blocks[3], grid=(5, 5)))})
    with pytest.raises(UnsupportedError, match=r"LiteMLA stages 0 and 1 are not one stride-2 layer apart "
                                               r"\(\(20, 20\) -> \(5, 5\)\)"):
        _family("efficientvit").sequence_grids(gapped, lambda s, grid: grid)


def test_feature_modules_are_the_last_block_or_stage():
    vit_model, swin_model = tiny_vit(), _swin()
    mvit = timm.create_model("mobilevit_xs", pretrained=False).eval()
    assert _family("vit").feature_module(vit_model) is vit_model.blocks[-1]
    assert _family("swin").feature_module(swin_model) is swin_model.layers[-1]
    assert _family("mobilevit").feature_module(mvit) is mvit.stages[-1]


def test_vit_final_features_are_the_last_blocks_patch_token_mean():
    model = tiny_vit()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    captured = []
    handle = model.blocks[-1].register_forward_hook(lambda m, a, out: captured.append(out))
    with torch.no_grad():
        model(images)
        handle.remove()
        expected = token_features(captured[0], model.num_prefix_tokens)
        assert torch.equal(_family("vit").final_features(model, images), expected)
        assert torch.equal(final_features(model, images), expected)
    assert _family("swin").final_features is None and _family("mobilevit").final_features is None  # the map's mean


def test_efficientvit_channel_reducer_is_sized_from_the_block():
    torch.manual_seed(0)
    model = timm.create_model("efficientvit_b0", pretrained=False).eval()
    block = efficientvit.describe(model).blocks[0]
    reducer = _family("efficientvit").channel_reducer.from_block(block, "both", False, 4.5)
    assert reducer.num_heads == efficientvit.BRANCHES * block.num_heads
    assert reducer.head_dim == block.dim // block.num_heads and reducer.in_channels == block.dim
    assert reducer.out_gate.alpha.numel() == efficientvit.BRANCHES * block.dim
    assert float(reducer.tau) == 4.5
