"""LTM on EfficientViT (docs/methods.md §5, "Conv hybrids"): each stage's first block merges its
map to an H'xW' grid between the LiteMLA and the MBConv, the later stages see the smaller map,
ratio 1 untrained is the identity, and the statistics / training / checkpoint machinery works
with the two stage widths. Random-init ``efficientvit_b1``, one thread."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from ltm_support import ltm_training_step
from vitbench_plugins.ltm.reduction import FirstMerge, ReMerge

import vitbench
from vitbench.engine import reduction_context
from vitbench.measure.flops import count_gmacs

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(size: int, num_classes: int = 10) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("efficientvit_b1", pretrained=False, num_classes=num_classes).eval()
    model.vitbench_input_size = (size, size)
    return model


def _reducers(model):
    return [blk.reducer for blk in model.modules() if hasattr(blk, "reducer") and blk.reducer is not None]


def _lite_mla_inputs(model, x):
    from timm.models.efficientvit_mit import LiteMLA

    seen: list[tuple[int, ...]] = []
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))
             for m in model.modules() if isinstance(m, LiteMLA)]
    with torch.inference_mode():
        logits = model(x)
    for h in hooks:
        h.remove()
    return logits, seen


def test_ratio_05_at_128_merges_each_stage_and_the_next_stage_sees_the_smaller_map():
    base = _model(128)
    model = vitbench.apply(copy.deepcopy(base), "ltm", ratio=0.5)
    firsts = [r for r in _reducers(model) if isinstance(r, FirstMerge)]
    # stage 2: 8x8 -> ceil(8 sqrt(0.5)) = 6; stage 3 sees ceil(6/2) = 3 (not 4) and keeps 3x3
    assert [(f.num_patches, f.cells, f.p) for f in firsts] == [(64, (6, 6), 36), (9, (3, 3), 9)]
    remerges = [r for r in _reducers(model) if isinstance(r, ReMerge)]
    assert [r.p for r in remerges] == [36, 36, 9, 9, 9]
    assert [r.mlp[1].in_features for r in remerges] == [128, 128, 256, 256, 256]
    x = torch.randn(2, 3, 128, 128)
    logits, inputs = _lite_mla_inputs(model, x)
    assert logits.shape == (2, 10)
    # a stage's first LiteMLA sees the full map, the rest the merged one (unreduced: 8, 8, 8, 4 x4)
    assert inputs == [(2, 128, 8, 8), (2, 128, 6, 6), (2, 128, 6, 6)] + [(2, 256, 3, 3)] * 4
    assert reduction_context(model).token_counts == [36] * 3 + [9] * 4
    assert not reduction_context(model).trace_source  # grid merges need no unmerge
    assert count_gmacs(model, x[:1]).mean < count_gmacs(base, x[:1]).mean


def test_ratio_1_untrained_keeps_the_maps_and_is_the_identity_up_to_the_masks_leak():
    base = _model(64)
    x = torch.randn(2, 3, 64, 64)
    ref, ref_inputs = _lite_mla_inputs(base, x)
    model = vitbench.apply(copy.deepcopy(base), "ltm", ratio=1.0)
    for r in _reducers(model):
        if isinstance(r, ReMerge):
            r.scale.data.fill_(1e4)  # no mixing at all: only the first masks' e^-12 leak is left
    got, inputs = _lite_mla_inputs(model, x)
    assert inputs == ref_inputs and reduction_context(model).token_counts == [16] * 3 + [4] * 4
    assert (got - ref).abs().max() < 1e-3


def _data(size: int = 128):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 3, size, size, generator=g), torch.arange(6) % 10)]
    return lambda: iter(data)


def test_statistics_training_and_checkpoints_with_the_stage_widths(tmp_path):
    model = vitbench.apply(_model(128), "ltm", ratio=0.5)
    stage = reduction_context(model).reduction.train[0]
    stage.before[0](model, _data())  # statistics pass (and the IB feature hook)
    buffers = {n: tuple(b.shape) for n, b in model.named_buffers() if ".reducer." in n}
    assert buffers["stages.2.blocks.2.reducer.centroids"] == (10, 36, 128)
    assert buffers["stages.3.blocks.4.reducer.centroids"] == (10, 9, 256)
    assert buffers["stages.2.blocks.1.reducer.feature_centroids"] == (10, 256)  # the last stage's map
    grads = ltm_training_step(model, *next(_data()()))
    assert grads["stages.2.blocks.1.reducer.logits"].abs().sum() > 0
    assert grads["stages.3.blocks.2.reducer.mask_logits"] is not None
    keys = set(model.state_dict())
    assert "stages.2.blocks.1.context_module.main.qkv.conv.weight" in keys  # timm's keys
    path = tmp_path / "ltm.pt"
    torch.save(model.state_dict(), path)
    fresh = vitbench.apply(_model(128), "ltm", ratio=0.5)
    state = torch.load(path, weights_only=True)
    reduction_context(fresh).reduction.prepare_load(fresh, state)
    fresh.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, 128, 128)
    with torch.inference_mode():
        assert torch.equal(model(x), fresh(x))
        assert torch.equal(copy.deepcopy(fresh)(x), fresh(x))


def test_an_input_size_other_than_the_described_one_is_a_clear_error():
    model = vitbench.apply(_model(128), "ltm", ratio=0.5)
    with pytest.raises(ValueError, match="expects 64 patch tokens, got 16"), torch.inference_mode():
        model(torch.randn(1, 3, 64, 64))
