"""Group maps (vitbench.visualize.groups): the drawn groups are the token state, block by block."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import vitbench
from vitbench.tasks.cls import DEFAULT_MODEL
from vitbench.testing import tiny_deit_distilled
from vitbench.visualize import DROPPED, group_map, trace_groups
from vitbench.visualize.draw import GREY, paint
from vitbench.visualize.inputs import load_image, load_vit

ALL_BLOCKS = list(range(12))


def _patches(model) -> int:
    return int(model.patch_embed.num_patches)


def _check_partition(maps, patches: int) -> None:
    """Every patch in exactly one group (or dropped); groups numbered 0 .. G-1 without gaps."""
    for m in maps:
        labels = m.groups.flatten()
        assert labels.numel() == patches
        kept = labels[labels != DROPPED]
        assert sorted(set(kept.tolist())) == list(range(m.num_groups))
        assert m.num_groups + m.num_dropped <= patches


@pytest.fixture(scope="module")
def default_vit():
    return load_vit(DEFAULT_MODEL)


def test_tome_groups_equal_tokens_on_the_default_model(default_vit):
    import copy

    x, _, _ = load_image(default_vit, None, 0)
    model = vitbench.apply(copy.deepcopy(default_vit), "tome", r=4)
    maps = trace_groups(model, x, ALL_BLOCKS)
    assert [m.tokens for m in maps] == [65 - 4 * (b + 1) for b in ALL_BLOCKS]
    for m in maps:
        assert m.num_groups == m.tokens - m.prefix and m.num_dropped == 0
    _check_partition(maps, 64)
    assert maps[-1].num_groups == 16


def test_tome_groups_equal_tokens_on_deit_tiny_random_weights():
    model = vitbench.apply(load_vit("deit_tiny_patch16_224"), "tome", r=13)
    x, picture, _ = load_image(model, None, 0)
    assert x.shape == (1, 3, 224, 224) and picture.shape == (224, 224, 3)
    maps = trace_groups(model, x, [0, 5, 11])
    assert [m.tokens for m in maps] == [197 - 13, 197 - 6 * 13, 197 - 12 * 13]
    for m in maps:
        assert m.num_groups == m.tokens - m.prefix and m.num_dropped == 0
    _check_partition(maps, _patches(model))


@pytest.mark.parametrize("fuse", [False, True])
def test_topk_kept_groups_and_dropped_patches_add_up(default_vit, fuse):
    import copy

    x, _, _ = load_image(default_vit, None, 3)
    model = vitbench.apply(copy.deepcopy(default_vit), "topk", keep=0.5, layers=(2, 5), fuse=fuse)
    maps = trace_groups(model, x, [1, 2, 5, 11])
    counts = [(m.num_groups, m.num_dropped) for m in maps]
    if fuse:  # EViT's fused token stands for every dropped patch: one more group, nothing dropped
        assert counts == [(64, 0), (33, 0), (18, 0), (18, 0)]
    else:
        assert counts == [(64, 0), (32, 32), (16, 48), (16, 48)]
    for m in maps:
        assert m.num_groups == m.tokens - m.prefix
        if not fuse:
            assert m.num_groups + m.num_dropped == 64
    _check_partition(maps, 64)


def test_group_map_numbers_groups_in_raster_order_and_marks_dropped():
    # two prefix tokens (class, distillation), a 2x2 grid: token 2 holds patches 1 and 2,
    # token 3 holds patch 0, patch 3 was pruned
    source = torch.zeros(4, 6)
    source[0, 0] = source[1, 1] = 1
    source[2, 3] = source[2, 4] = 1
    source[3, 2] = 1
    groups = group_map(source, prefix=2, grid=(2, 2))
    assert groups.tolist() == [[0, 1], [1, DROPPED]]


def test_distilled_deit_keeps_both_prefix_tokens_out_of_the_map():
    model = vitbench.apply(tiny_deit_distilled(), "tome", r=8)
    maps = trace_groups(model, torch.randn(1, 3, 32, 32), [0, 3])
    assert [m.prefix for m in maps] == [2, 2]
    assert [m.num_groups for m in maps] == [56, 32]


def test_trace_groups_needs_a_reduced_model():
    with pytest.raises(ValueError, match="reduced with vitbench.apply"):
        trace_groups(tiny_deit_distilled(), torch.randn(1, 3, 32, 32), [0])


def test_paint_tints_merged_greys_dropped_and_keeps_single_patches():
    picture = np.ones((4, 4, 3)) * 0.2
    groups = np.array([[0, 0], [1, DROPPED]])
    out = paint(picture, groups)
    s = out.shape[0] // 4
    assert out.shape == (4 * s, 4 * s, 3)
    inside = lambda r, c: out[r * 2 * s + s // 2, c * 2 * s + s // 2]  # noqa: E731 - a patch's inner pixel
    assert not np.allclose(inside(0, 0), 0.2)  # merged: tinted
    assert np.allclose(inside(1, 0), 0.2)  # on its own: plain
    assert np.allclose(inside(1, 1), 0.3 * 0.2 + 0.7 * GREY)  # dropped: grey
