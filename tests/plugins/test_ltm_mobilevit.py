"""LTM on MobileViT (docs/methods.md §5, "Conv hybrids"): per-sequence H'xW' grids that compound
through the smaller maps, the fusion shortcut merged with the same G, the untrained identity at
ratio 1, and the statistics / training / checkpoint machinery with per-block widths."""
from __future__ import annotations

import copy

import timm
import torch
from ltm_support import ltm_training_step
from mobilevit_support import block_output_shapes
from vitbench_plugins.ltm.reduction import FirstMerge, ReMerge

import vitbench
from vitbench.engine import reduction_context
from vitbench_plugins.mobilevit_family import adapter as mobilevit
from vitbench.engine.grid_merge import grid_merge


def _model(size: tuple[int, int], num_classes: int = 1000) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("mobilevit_xs", pretrained=False, num_classes=num_classes).eval()
    model.vitbench_input_size = size
    return model


def _reducers(model):
    return [blk.reducer for blk in model.modules() if hasattr(blk, "reducer")]


def _maps(model, x):
    logits, shapes = block_output_shapes(model, x)
    return logits, [shape[2:] for shape in shapes]


def test_ratio_07_at_256_gives_smaller_maps_after_every_mobilevit_block():
    model = vitbench.apply(_model((256, 256)), "ltm", ratio=0.7)
    firsts = [r for r in _reducers(model) if isinstance(r, FirstMerge)]
    # 16x16 -> 14x14 (map 28); the next block sees ceil(28/2/2) = 7 -> 6x6 (map 12); then 3 -> 3
    assert [(f.num_patches, f.cells, f.p) for f in firsts] == [(256, (14, 14), 196), (49, (6, 6), 36),
                                                               (9, (3, 3), 9)]
    assert [r.p for r in _reducers(model) if isinstance(r, ReMerge)] == [196, 36, 36, 36, 9, 9]
    assert [r.mlp[1].in_features for r in _reducers(model) if isinstance(r, ReMerge)] == [96, 120, 120, 120, 144, 144]
    logits, maps = _maps(model, torch.randn(1, 3, 256, 256))
    assert logits.shape == (1, 1000)
    assert maps == [(28, 28), (12, 12), (6, 6)]  # unreduced: 32, 16, 8
    assert reduction_context(model).token_counts == [196] * 2 + [36] * 4 + [9] * 3
    assert not reduction_context(model).trace_source  # grid merges need no unmerge


def test_ratio_1_untrained_keeps_the_maps_and_is_the_identity_up_to_the_remerge_mixing():
    base = _model((64, 64))
    x = torch.randn(2, 3, 64, 64)
    ref, ref_maps = _maps(base, x)
    model = vitbench.apply(copy.deepcopy(base), "ltm", ratio=1.0)
    got, maps = _maps(model, x)
    assert maps == ref_maps and reduction_context(model).token_counts == [16] * 2 + [4] * 4 + [1] * 3
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()  # later blocks mix 1% (s_l's init)
    for r in _reducers(model):
        if isinstance(r, ReMerge):
            r.scale.data.fill_(1e4)  # no mixing at all: only the first masks' e^-12 leak is left
    got, _ = _maps(model, x)
    assert (got - ref).abs().max() < 1e-3


def test_the_fusion_shortcut_is_merged_with_the_same_matrices():
    model = vitbench.apply(_model((128, 128)), "ltm", ratio=0.7)  # first block: 8x8 -> 7x7
    block = mobilevit.mobilevit_blocks(model)[0]
    ctx = reduction_context(model)
    seen = {}
    hooks = [block.register_forward_pre_hook(lambda m, a: seen.__setitem__("input", a[0])),
             block.transformer.register_forward_hook(lambda m, a, out: seen.__setitem__("record", grid_merge(ctx.state))),
             block.conv_fusion.register_forward_pre_hook(lambda m, a: seen.__setitem__("fused", a[0]))]
    x = torch.randn(2, 3, 128, 128)
    with torch.inference_mode():
        model(x)
    for h in hooks:
        h.remove()
    record = seen["record"]
    assert record.grid == (7, 7) and len(record.matrices) == 2  # FirstMerge, then one ReMerge
    tokens, grid = mobilevit.unfold(seen["input"], (2, 2))
    assert grid == (8, 8) and tokens.shape == (8, 64, 64)
    expected = mobilevit.fold(record.apply(tokens), 2, (7, 7), (2, 2))
    channels = seen["input"].shape[1]
    assert seen["fused"].shape == (2, channels + 64, 14, 14)
    torch.testing.assert_close(seen["fused"][:, :channels], expected)


def _data(size: int = 64):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 3, size, size, generator=g), torch.arange(6) % 10)]
    return lambda: iter(data)


def test_statistics_training_and_checkpoints_with_per_block_widths(tmp_path):
    model = vitbench.apply(_model((64, 64), num_classes=10), "ltm", ratio=0.5)  # 4x4 -> 3x3 first
    stage = reduction_context(model).reduction.train[0]
    stage.before[0](model, _data())  # statistics pass (and the IB feature hook)
    buffers = {n: tuple(b.shape) for n, b in model.named_buffers() if ".reducer." in n}
    assert buffers["stages.2.1.transformer.1.reducer.centroids"] == (10, 9, 96)
    assert buffers["stages.3.1.transformer.3.reducer.centroids"] == (10, 4, 120)
    assert buffers["stages.4.1.transformer.2.reducer.centroids"] == (10, 1, 144)
    # the bound's features: the last stage's map (the ib metric's), 96 channels, not a block's 144
    assert buffers["stages.2.1.transformer.0.reducer.feature_centroids"] == (10, 96)
    # one training step: labels per image reach the B*4 sequences, the IB bound is the extra loss
    grads = ltm_training_step(model, *next(_data()()))
    assert grads["stages.2.1.transformer.0.reducer.logits"].abs().sum() > 0
    assert all(g is not None for g in grads.values())
    # the checkpoint loads into a freshly reduced model
    path = tmp_path / "ltm.pt"
    torch.save(model.state_dict(), path)
    fresh = vitbench.apply(_model((64, 64), num_classes=10), "ltm", ratio=0.5)
    state = torch.load(path, weights_only=True)
    reduction_context(fresh).reduction.prepare_load(fresh, state)
    fresh.load_state_dict(state, strict=True)
    clone = copy.deepcopy(fresh)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        assert torch.equal(model(x), fresh(x))
        assert torch.equal(clone(x), fresh(x))


def test_an_input_size_other_than_the_described_one_is_a_clear_error():
    model = vitbench.apply(_model((128, 128)), "ltm", ratio=0.7)
    try:
        with torch.inference_mode():
            model(torch.randn(1, 3, 64, 64))
    except ValueError as err:
        assert "expects 64 patch tokens, got 16" in str(err)
    else:
        raise AssertionError("no error")
