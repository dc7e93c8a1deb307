"""The Swin family adapter on timm's ``SwinTransformer`` (V1; V2: test_swinv2.py): the tiles a
block's MLP is reduced in, the re-run window attention equal to timm's (shifted windows, masks,
padding), switched-off equality, token counts and sizes per tile, checkpoints, refusals, and the
published GMACs of Swin-T/B."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.models.swin_transformer import SwinTransformer

import vitbench
from vitbench.catalog import Reduction
from vitbench.engine import Reducer, reduction_context
from vitbench.engine.tiles import tile_of
from vitbench_plugins.swin_family.adapter import describe, patch
from vitbench.errors import UnsupportedError


def _small(img_size: int = 56) -> SwinTransformer:
    """Two stages (2 blocks each, the second of each shifted where the map exceeds the window)."""
    torch.manual_seed(0)
    return SwinTransformer(img_size=img_size, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                           num_classes=10).eval()


class _Identity(Reducer):
    """A reducer that keeps every token: the patched forward must then be timm's exactly."""

    needs = frozenset({"keys"})

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        assert info.keys is not None and info.keys.shape[:2] == x.shape[:2]
        return x


@pytest.mark.parametrize("size, window, tile", [
    ((56, 56), (7, 7), (7, 7)),     # Swin-T stage 1 at 224: the window
    ((80, 80), (7, 7), (8, 8)),     # 320 px: 8 is the divisor of 80 nearest 7
    ((20, 10), (7, 7), (5, 5)),
    ((13, 16), (7, 7), (13, 8)),    # a prime side: 1 and 13 tie, the larger wins
])
def test_tiles_cover_the_map_without_padding(size, window, tile):
    assert tile_of(size, window) == tile
    assert size[0] % tile[0] == 0 and size[1] % tile[1] == 0


@pytest.mark.parametrize("img_size", [56, 64])  # 64: maps 16 and 8, padded windows in attention
def test_a_reducer_that_keeps_everything_is_timm(img_size):
    model = _small(img_size)
    x = torch.randn(2, 3, img_size, img_size)
    with torch.inference_mode():
        ref = model(x)
        out = patch(copy.deepcopy(model), Reduction([_Identity()] * 4))(x)
    assert torch.equal(out, ref)


def test_r_zero_is_the_unpatched_model():
    model = _small()
    x = torch.randn(2, 3, 56, 56)
    reduced = vitbench.apply(copy.deepcopy(model), "tome", r=0)
    with torch.inference_mode():
        assert torch.equal(reduced(x), model(x))


def test_tome_counts_and_sizes_per_tile():
    """56 px: stage maps 14 and 7, tiles of 49 tokens; r=10 leaves 39 per tile in every block,
    whose sizes add up to the 49 tokens of each of the B*4 (stage 1) or B*1 (stage 2) tiles."""
    model = vitbench.apply(_small(), "tome", r=10)
    x = torch.randn(2, 3, 56, 56)
    with torch.inference_mode():
        out = model(x)
    ctx = reduction_context(model)
    assert ctx.token_counts == [39, 39, 39, 39]
    assert ctx.state.size.shape == (2, 39, 1)  # the last block: one tile per image
    assert torch.equal(ctx.state.size.sum(dim=1), torch.full((2, 1), 49.0))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_describe_gives_each_block_its_tile():
    info = describe(_small(64))
    assert info.family == "swin" and info.depth == 4 and info.num_prefix_tokens == 0
    assert [b.grid for b in info.blocks] == [(8, 8)] * 4  # maps 16 and 8: tiles of 8
    assert [b.dim for b in info.blocks] == [16, 16, 32, 32] and info.max_patches == 64


def test_checkpoints_keep_timm_keys():
    model = _small()
    reduced = vitbench.apply(copy.deepcopy(model), "tome", r=4)
    assert list(reduced.state_dict()) == list(model.state_dict())
    reduced.load_state_dict(model.state_dict(), strict=True)


def test_refusals():
    with pytest.raises(UnsupportedError, match="needs cls_attn, which the 'swin' family"):
        vitbench.apply(_small(), "topk")  # needs the class token's attention
    from timm.models.swin_transformer_v2_cr import SwinTransformerV2Cr

    torch.manual_seed(0)  # timm's other Swin V2 (its own blocks; Swin V2 proper: test_swinv2.py)
    swinv2_cr = SwinTransformerV2Cr(img_size=(64, 64), embed_dim=16, depths=(2,), num_heads=(1,), window_size=8)
    with pytest.raises(UnsupportedError, match="no model-family adapter recognises SwinTransformerV2Cr"):
        vitbench.apply(swinv2_cr, "tome", r=2)

    class _WantsCls(Reducer):
        needs = frozenset({"cls_attn"})

        def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
            return x

    with pytest.raises(UnsupportedError, match=r"^m needs cls_attn, which this model family does not provide "
                                               r"\(it provides channels, grid_merges, keys, received_attn, "):
        patch(_small(), Reduction([_WantsCls(), None, None, None]), method="m")


@pytest.mark.slow
@pytest.mark.parametrize("name, baseline, r, tome", [
    ("swin_tiny_patch4_window7_224", 4.49, 10, 3.93),   # IBTM paper's table: 4.50 -> ToMe 3.91
    ("swin_base_patch4_window7_224", 15.43, 12, 13.02),  # 15.4 -> ToMe 13.0
])
def test_swin_gmacs(name, baseline, r, tome):
    """Baseline GMACs as timm's (4.5 / 15.4); ToMe's ``r`` per 49-token tile cuts the MLPs (2/3 of
    the MACs) by r/49: r=10 on Swin-T and r=12 on Swin-B land at the published ToMe rows."""
    from vitbench.measure.flops import count_gmacs_at

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    assert count_gmacs_at(model).mean == pytest.approx(baseline, abs=0.01)
    assert count_gmacs_at(vitbench.apply(model, "tome", r=r)).mean == pytest.approx(tome, abs=0.01)
