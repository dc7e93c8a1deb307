"""The MobileViT family adapter: description, exactness of the no-op patch, ToMe per token
sequence with unmerge back to the full map, deepcopy, checkpoints and clear errors."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from mobilevit_support import block_output_shapes

import vitbench
from vitbench.catalog import Reduction
from vitbench.engine import reduction_context
from vitbench_plugins.mobilevit_family import adapter as mobilevit
from vitbench.errors import UnsupportedError


def _model(name: str = "mobilevit_xs", size: tuple[int, int] | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    if size is not None:
        model.vitbench_input_size = size
    return model


@pytest.fixture(scope="module")
def xs():
    return _model()


def _block_outputs(model, x):
    return block_output_shapes(model, x)


def test_describe_mobilevit_xs(xs):
    info = mobilevit.describe(xs)
    assert info.family == "mobilevit" and info.depth == 9 and len(info.blocks) == 9
    assert [b.dim for b in info.blocks] == [96] * 2 + [120] * 4 + [144] * 3
    assert [b.sequence for b in info.blocks] == [0] * 2 + [1] * 4 + [2] * 3
    assert [i for i, b in enumerate(info.blocks) if b.first] == [0, 2, 6]
    assert [b.grid for b in info.blocks if b.first] == [(16, 16), (8, 8), (4, 4)]  # 256 / 8, 16, 32, / 2
    assert [b.num_patches for b in info.blocks if b.first] == [256, 64, 16]
    assert {b.num_heads for b in info.blocks} == {4}
    assert info.input_size == (256, 256) and info.num_prefix_tokens == 0 and info.global_pool == "avg"
    assert (info.embed_dim, info.num_patches, info.grid) == (96, 256, (16, 16))


def test_describe_follows_the_input_size_with_ceil_strides():
    model = _model(size=(100, 76))  # maps 13x10, 7x5, 4x3 (timm's strided convs round up)
    info = mobilevit.describe(model)
    assert [b.grid for b in info.blocks if b.first] == [(7, 5), (4, 3), (2, 2)]
    _, shapes = _block_outputs(model, torch.randn(1, 3, 100, 76))
    assert [s[2:] for s in shapes] == [(13, 10), (7, 5), (4, 3)]


def test_describe_mobilevit_s():
    info = mobilevit.describe(_model("mobilevit_s"))
    assert [b.dim for b in info.blocks if b.first] == [144, 192, 240]
    assert [len([b for b in info.blocks if b.sequence == s]) for s in range(3)] == [2, 4, 3]


@pytest.mark.parametrize("size", [(64, 64), (50, 38)])  # 50x38: odd maps, timm's bilinear resize
def test_noop_patch_equals_the_unpatched_model(xs, size):
    x = torch.randn(2, 3, *size)
    patched = mobilevit.patch(copy.deepcopy(xs), Reduction([None] * 9), method="noop")
    with torch.inference_mode():
        assert torch.equal(patched(x), xs(x))
        assert torch.equal(patched.forward_features(x), xs.forward_features(x))
    if size == (64, 64):
        assert reduction_context(patched).token_counts == [16] * 2 + [4] * 4 + [1] * 3


def test_state_dict_keys_stay_timm_and_load(xs):
    reduced = vitbench.apply(_model(), "tome", r=2)
    assert list(reduced.state_dict()) == list(xs.state_dict())
    reduced.load_state_dict(xs.state_dict())


def test_tome_r0_equals_the_unpatched_model(xs):
    x = torch.randn(2, 3, 64, 64)
    reduced = vitbench.apply(copy.deepcopy(xs), "tome", r=0)
    with torch.inference_mode():
        assert torch.equal(reduced(x), xs(x))
    assert not reduction_context(reduced).trace_source  # nothing to unmerge


def test_tome_merges_per_sequence_and_unmerges_to_the_full_map(xs):
    x = torch.randn(2, 3, 128, 128)  # sequences of 64, 16, 4 tokens
    base_logits, base_shapes = _block_outputs(xs, x)
    reduced = vitbench.apply(copy.deepcopy(xs), "tome", r=2)
    logits, shapes = _block_outputs(reduced, x)
    # the state restarts at each MobileViT block; r is capped at N//2 (4 -> 2 -> 1 -> 1)
    assert reduction_context(reduced).token_counts == [62, 60, 14, 12, 10, 8, 2, 1, 1]
    assert logits.shape == base_logits.shape == (2, 1000)
    assert shapes == base_shapes  # unmerged and folded back to the unreduced maps
    assert not torch.allclose(logits, base_logits)
    state = reduction_context(reduced).state
    assert state.source.shape == (8, 1, 4) and state.size.sum(1).eq(4).all()  # B*4 sequences


def test_tome_r_is_capped_on_the_16_token_sequence_at_256():
    model = _model()
    reduced = vitbench.apply(model, "tome", r=13)
    with torch.inference_mode():
        reduced(torch.randn(1, 3, 256, 256))
    counts = reduction_context(reduced).token_counts
    assert counts == [243, 230, 51, 38, 25, 13, 8, 4, 2]  # 64: 25 -> 13 (cap 12); 16: cap 8, 4, 2


def test_deepcopy_of_a_patched_model(xs):
    reduced = vitbench.apply(copy.deepcopy(xs), "tome", r=3)
    clone = copy.deepcopy(reduced)
    for blk in mobilevit.mobilevit_blocks(clone):
        assert blk.forward.block is blk and blk.forward.context is reduction_context(clone)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        assert torch.equal(clone(x), reduced(x))
    assert reduction_context(clone).token_counts == reduction_context(reduced).token_counts


def test_inputs_are_remembered(xs):
    reduced = vitbench.apply(copy.deepcopy(xs), "tome", r=1)
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        reduced(x)
    assert reduction_context(reduced).inputs is x


@pytest.mark.parametrize("method, missing", [("topk", "cls_attn"), ("ppt", "cls_attn"), ("sinkhorn", "one_width"),
                                             ("algm", "patch_grid")])
def test_vit_only_methods_are_refused(xs, method, missing):
    with pytest.raises(UnsupportedError, match=rf"method '{method}' needs {missing}, which the 'mobilevit' family "
                                               rf"\(ByobNet\) does not provide; {method} runs on: vit"):
        vitbench.apply(copy.deepcopy(xs), method)


def test_mobilevitv2_is_unsupported_with_a_clear_error():
    model = timm.create_model("mobilevitv2_050", pretrained=False)
    with pytest.raises(UnsupportedError, match=r"MobileVitV2Block.*supports MobileVitBlock .*mobilevit_xs"):
        vitbench.apply(model, "tome", r=2)


def test_applying_twice_is_an_error(xs):
    reduced = vitbench.apply(copy.deepcopy(xs), "tome", r=2)
    with pytest.raises(UnsupportedError, match="already reduced by 'tome'"):
        vitbench.apply(reduced, "tome", r=2)
