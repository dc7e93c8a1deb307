"""The controls: ``random`` (tokens dropped at random at top-k's schedule) and ``downsample`` (a
smaller image): token counts against oracles, equality with the model they stand for, the
seed's role, conformance, and the family they are limited to (docs/methods.md, "Controls")."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError, UnsupportedError
from vitbench.testing import tiny_vit
from vitbench.testing.conformance import check_method
from vitbench_plugins.controls.reduction import smaller_grid

X = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _forward(model, x=X):
    with torch.inference_mode():
        return model(x)


def test_random_keeps_ceil_keep_times_patches_at_listed_blocks():
    model = vitbench.apply(tiny_vit(), "random", keep=0.7)
    _forward(model)
    k1 = math.ceil(0.7 * 64)
    k2 = math.ceil(0.7 * k1)
    k3 = math.ceil(0.7 * k2)
    assert reduction_context(model).token_counts == [65] * 3 + [1 + k1] * 3 + [1 + k2] * 3 + [1 + k3] * 3


def test_random_keeping_everything_is_the_unpatched_model():
    base = tiny_vit()
    assert torch.equal(_forward(vitbench.apply(copy.deepcopy(base), "random", keep=1.0)), _forward(base))


def _random_under_seed(seed):
    model = tiny_vit()  # seeds torch itself: the run's seed is set after
    torch.manual_seed(seed)
    return vitbench.apply(model, "random", keep=0.5, layers=(0,))


def test_random_positions_come_from_the_seed_and_not_from_the_batch():
    model = _random_under_seed(3)
    whole = _forward(model)
    alone = torch.cat([_forward(model, X[i:i + 1]) for i in range(len(X))])
    torch.testing.assert_close(alone, whole, rtol=1e-5, atol=1e-5)  # an image's drops are its own, not its batch's
    assert torch.equal(_forward(_random_under_seed(3)), whole)
    assert not torch.allclose(_forward(_random_under_seed(4)), whole)


@pytest.mark.parametrize("grid, keep, expected", [
    ((14, 14), 0.7, (12, 11)),   # at most 138 patches: 12x11 = 132 (13x10 shrinks its sides too unevenly)
    ((14, 14), 1.0, (14, 14)),
    ((14, 14), 0.5, (10, 9)),    # at most 98: 10x9 = 90 (11x8 too uneven)
    ((8, 8), 0.6, (6, 6)),       # at most 39: 6x6 = 36 (7x5 too uneven, 7x6 too many)
    ((7, 7), 0.001, (1, 1)),
])
def test_the_smaller_grid_has_the_most_patches_of_the_models_shape(grid, keep, expected):
    rows, cols = smaller_grid(grid, keep)
    most = math.ceil(keep * grid[0] * grid[1] - 1e-9)
    assert rows * cols <= most and rows <= grid[0] and cols <= grid[1]
    assert 1 / 1.25 <= (rows / grid[0]) / (cols / grid[1]) <= 1.25
    better = [(r, c) for r in range(1, grid[0] + 1) for c in range(1, grid[1] + 1)
              if rows * cols < r * c <= most and 1 / 1.25 <= (r / grid[0]) / (c / grid[1]) <= 1.25]
    assert better == []  # no grid of the model's shape holds more
    assert (rows, cols) == expected


def test_downsample_is_the_model_fed_the_smaller_image():
    """Oracle: timm's own model at the smaller size (``set_input_size``) fed the resized image."""
    base = tiny_vit()
    reduced = vitbench.apply(copy.deepcopy(base), "downsample", keep=0.5)
    rows, cols = smaller_grid((8, 8), 0.5)
    oracle = copy.deepcopy(base)
    oracle.set_input_size(img_size=(4 * rows, 4 * cols))
    small = F.interpolate(X, size=(4 * rows, 4 * cols), mode="bilinear", antialias=True, align_corners=False)
    torch.testing.assert_close(_forward(reduced), _forward(oracle, small), rtol=0, atol=0)
    assert reduction_context(reduced).token_counts == [1 + rows * cols] * 12


def test_downsample_keeping_everything_is_the_unpatched_model():
    base = tiny_vit()
    assert torch.equal(_forward(vitbench.apply(copy.deepcopy(base), "downsample", keep=1.0)), _forward(base))


def test_downsample_gmacs_are_those_of_the_smaller_model():
    from vitbench import measure

    base = tiny_vit()
    reduced = vitbench.apply(copy.deepcopy(base), "downsample", keep=0.5)
    rows, cols = smaller_grid((8, 8), 0.5)
    smaller = tiny_vit(img_size=(4 * rows, 4 * cols))
    g_reduced = measure.count_gmacs(reduced, X[:1]).mean
    g_smaller = measure.count_gmacs(smaller, torch.randn(1, 3, 4 * rows, 4 * cols)).mean
    assert g_reduced == pytest.approx(g_smaller, rel=0.02)  # the resize's own MACs at most
    assert g_reduced < 0.6 * measure.count_gmacs(base, X[:1]).mean


@pytest.mark.parametrize("method, params", [("random", {}), ("random", {"keep": 0.5, "layers": (0, 5)}),
                                            ("downsample", {}), ("downsample", {"keep": 0.3})])
def test_the_controls_conform(method, params):
    report = check_method(method, params)
    assert report.token_counts[-1] < 65


def test_the_controls_refuse_bad_values_and_other_families():
    with pytest.raises(ParamError, match="keep"):
        vitbench.apply(tiny_vit(), "downsample", keep=0.0)
    with pytest.raises(ParamError, match="layers"):
        vitbench.apply(tiny_vit(), "random", layers=(12,))
    import timm

    mobilevit = timm.create_model("mobilevit_xxs", pretrained=False, num_classes=10)
    with pytest.raises(UnsupportedError, match="needs smaller_input, which the 'mobilevit' family .* downsample runs "
                                               "on: swin, vit"):
        vitbench.apply(mobilevit, "downsample")


def _swin(img_size: int = 112, seed: int = 0):
    """Swin of three stages (a smaller input's sides: multiples of 4 patches), windows of 7."""
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(seed)
    return SwinTransformer(img_size=img_size, embed_dim=16, depths=(2, 2, 2), num_heads=(1, 2, 2), window_size=7,
                           num_classes=10).eval()


SWIN_X = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("keep, grid", [(0.7, (24, 20)), (0.5, (20, 16)), (0.3, (12, 12)), (0.01, (4, 4))])
def test_downsample_on_swin_is_timms_model_at_the_smaller_size_with_no_window_padded(keep, grid):
    """Oracle: timm's Swin made for the smaller size (``set_input_size``, windows scaled with the
    grid) fed the resized image. 112 px is 28x28 patches, 7x7 windows: a side of 4k patches
    gets windows of k, which divide every stage's map (4k, 2k, k)."""
    assert smaller_grid((28, 28), keep, 4) == grid
    reduced = vitbench.apply(_swin(), "downsample", keep=keep)
    oracle = _swin()
    size = (4 * grid[0], 4 * grid[1])
    oracle.set_input_size(img_size=size)
    small = F.interpolate(SWIN_X, size=size, mode="bilinear", antialias=True, align_corners=False)
    torch.testing.assert_close(_forward(reduced, SWIN_X), _forward(oracle, small), rtol=0, atol=0)
    for stage in reduced.layers:
        for blk in stage.blocks:
            inner = blk.block
            assert all(r % w == 0 for r, w in zip(inner.input_resolution, inner.window_size)), "a padded window"


def test_downsample_on_swin_keeping_everything_is_the_unpatched_model():
    assert torch.equal(_forward(vitbench.apply(_swin(), "downsample", keep=1.0), SWIN_X), _forward(_swin(), SWIN_X))


def test_downsample_on_swin_saves_gmacs_by_the_patches_it_drops():
    from vitbench import measure

    full = measure.count_gmacs(_swin(), SWIN_X[:1]).mean
    half = measure.count_gmacs(vitbench.apply(_swin(), "downsample", keep=0.5), SWIN_X[:1]).mean
    assert 0.3 * full < half < (320 / 784) * full * 1.02  # 20x16 of 28x28 patches, smaller windows too
