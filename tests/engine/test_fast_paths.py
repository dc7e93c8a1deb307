"""The half-precision fast paths of the engine (issue 11, item 2) compute what the plain forms do:
the few-pass size-weighted merge, proportional attention as an extra query/key channel, and
the device-only forwards CUDA graphs need (vitbench/engine/matching.py, attention.py, host_sync.py)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import TokenState, bipartite_soft_matching
from vitbench.engine import attention
from vitbench.engine.attention import bias_channel, sdpa_with_key_bias, set_bias_channel
from vitbench.engine.host_sync import device_only, host_reads_allowed
from vitbench.engine.token_state import PrefixTokenError


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    """A 3-block ViT on 32x32 images (64 patches + class token), seeded, eval mode."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=3, num_heads=2, num_classes=10).eval()


def _textbook_merge(m, x, size):
    merged = m.merge(torch.cat([x * size, size], dim=-1), mode="sum")
    return merged[..., :-1] / merged[..., -1:], merged[..., -1:]


@pytest.mark.parametrize("prefix", [0, 1, 2, 5])
@pytest.mark.parametrize("n", [50, 51, 197])
def test_weighted_merge_equals_the_textbook_merge(prefix, n):
    torch.manual_seed(n + prefix)
    x = torch.randn(3, n, 16, dtype=torch.float64)
    size = torch.rand(3, n, 1, dtype=torch.float64) * 4 + 1
    m = bipartite_soft_matching(torch.randn(3, n, 8, dtype=torch.float64), 12, prefix)
    fast_x, fast_size = m.weighted_merge(x, size)
    ref_x, ref_size = _textbook_merge(m, x, size)
    assert fast_x.shape == ref_x.shape == (3, n - m.r, 16)
    assert torch.allclose(fast_x, ref_x, atol=1e-12) and torch.equal(fast_size, ref_size)
    assert torch.equal(fast_x[:, :prefix], x[:, :prefix])  # prefix tokens untouched


def test_weighted_merge_passes_gradients_like_the_textbook_merge():
    torch.manual_seed(0)
    x = torch.randn(2, 21, 8, dtype=torch.float64, requires_grad=True)
    size = torch.rand(2, 21, 1, dtype=torch.float64) + 1
    m = bipartite_soft_matching(torch.randn(2, 21, 4, dtype=torch.float64), 5, 1)
    (g_fast,) = torch.autograd.grad(m.weighted_merge(x, size)[0].square().sum(), x)
    (g_ref,) = torch.autograd.grad(_textbook_merge(m, x, size)[0].square().sum(), x)
    assert torch.allclose(g_fast, g_ref, atol=1e-12)


def test_token_state_merge_uses_the_fast_merge_and_keeps_sources():
    torch.manual_seed(0)
    x = torch.randn(2, 17, 8)
    state = TokenState.start(x, prefix=1, trace_source=True)
    state.size = torch.rand(2, 17, 1) + 1
    m = bipartite_soft_matching(torch.randn(2, 17, 4), 4, 1)
    ref_x, ref_size = _textbook_merge(m, x, state.size)
    out = state.merge(x, m)
    assert torch.allclose(out, ref_x, atol=1e-6) and torch.allclose(state.size, ref_size)
    assert state.source.shape == (2, 13, 17) and torch.equal(state.source.sum(1), torch.ones(2, 17))


@pytest.mark.parametrize("head_dim", [40, 48, 64, 63])
def test_key_bias_as_a_channel_equals_the_masked_kernel(head_dim):
    torch.manual_seed(head_dim)
    q, k, v = (torch.randn(2, 3, 29, head_dim) for _ in range(3))
    bias = (torch.rand(2, 1, 1, 29) * 20 + 1).log()
    bias[0, ..., 3] = float("-inf")  # a masked key stays masked
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out = sdpa_with_key_bias(q, k, v, bias, head_dim ** -0.5)
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=2e-6)


def test_bias_channel_policy():
    q = torch.zeros(1, 1, 2, 8)
    bias = torch.zeros(1, 1, 1, 2)
    assert not bias_channel(q, bias) and not bias_channel(q.bfloat16(), bias)  # auto: CUDA half only
    old = set_bias_channel("always")
    try:
        assert bias_channel(q, bias)
        assert not bias_channel(q, torch.zeros(1, 1, 2, 2))  # a per-query mask cannot be one channel
    finally:
        set_bias_channel(old)
    with pytest.raises(ValueError, match="valid modes: auto, always, never"):
        set_bias_channel("sometimes")
    assert attention.BIAS_CHANNEL == "auto"


def test_tome_logits_with_the_bias_channel_equal_the_masked_kernel(vit):
    tome = vitbench.apply(copy.deepcopy(vit), "tome", r=4).eval()
    images = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        masked = tome(images)
        old = set_bias_channel("always")
        try:
            channel = tome(images)
        finally:
            set_bias_channel(old)
    assert torch.allclose(channel, masked, atol=1e-5)


def test_device_only_forbids_host_reads_and_nests():
    assert host_reads_allowed()
    with device_only():
        with device_only():
            assert not host_reads_allowed()
        assert not host_reads_allowed()
    assert host_reads_allowed()


def test_keep_skips_its_host_check_only_inside_device_only():
    x = torch.randn(1, 4, 2)
    bad = torch.tensor([[1, 0, 2]])  # reorders the class token
    with pytest.raises(PrefixTokenError):
        TokenState.start(x, prefix=1).keep(x, bad)
    with device_only():  # the check reads the device; the eager forward before a capture ran it
        assert TokenState.start(x, prefix=1).keep(x, bad).shape == (1, 3, 2)


@pytest.mark.parametrize("threshold", [0.0, 1e9])
def test_ppt_device_only_equals_the_host_branching_forward(vit, threshold):
    """Inside device_only PPT computes both branches and picks per image: the same logits as its
    host shortcuts when every image prunes (threshold 0) or every image pools (1e9). A mixed
    batch takes the both-branches path either way."""
    torch.manual_seed(0)
    images = torch.randn(4, 3, 32, 32)
    model = vitbench.apply(copy.deepcopy(vit), "ppt", r=6, layers=(1,), threshold=threshold).eval()
    with torch.inference_mode():
        host = model(images)
        with device_only():
            device = model(images)
    assert torch.allclose(host, device, atol=1e-6)


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("with_sizes", [False, True])
def test_merge_or_keep_equals_merge_keep_and_select(prefix, with_sizes):
    """PPT's per-image choice in one pass equals the two branches computed whole and selected."""
    torch.manual_seed(prefix)
    b, n, r = 5, 23, 6
    x = torch.randn(b, n, 16)
    m = bipartite_soft_matching(torch.randn(b, n, 8), r, prefix)
    scores = torch.randn(b, n - prefix)
    index = torch.cat([torch.arange(prefix).expand(b, prefix),
                       scores.argsort(dim=1, descending=True)[:, : n - prefix - r] + prefix], dim=1)
    rows = torch.tensor([True, False, True, False, False])
    sizes = torch.rand(b, n, 1) * 3 + 1 if with_sizes else None

    def start():
        state = TokenState.start(x, prefix)
        state.size = None if sizes is None else sizes.clone()
        return state

    fast = start()
    out = fast.merge_or_keep(x, m, index, rows)
    slow, merged, kept = start(), start(), start()
    x_merge, x_keep = merged.merge(x, m), kept.keep(x, index)
    slow.select(rows, merged, kept)
    expected = torch.where(rows[:, None, None], x_merge, x_keep)
    assert torch.equal(out, expected) and torch.equal(fast.size, slow.size)


def test_merge_or_keep_while_tracing_sources_takes_both_branches():
    torch.manual_seed(0)
    x = torch.randn(2, 11, 4)
    m = bipartite_soft_matching(torch.randn(2, 11, 4), 3, 1)
    index = torch.cat([torch.zeros(2, 1, dtype=torch.long), torch.arange(1, 8).expand(2, 7)], dim=1)
    state = TokenState.start(x, 1, trace_source=True)
    out = state.merge_or_keep(x, m, index, torch.tensor([True, False]))
    assert out.shape == (2, 8, 4) and state.source.shape == (2, 8, 11)
    assert torch.equal(out[1], x[1, :8])  # the second image kept its first 8 tokens


@pytest.mark.parametrize("heads", [1, 2, 3, 12])
def test_head_mean_is_the_mean_over_the_heads_of_a_strided_view(heads):
    """ToMe's metric on a CPU: the heads added slice by slice equal ``k.mean(dim=1)`` on the keys
    as the attention slices them out of qkv (a strided view), and gradients reach the keys."""
    from vitbench.engine.attention import head_mean

    torch.manual_seed(0)
    qkv = torch.randn(2, 7, 3, heads, 8, requires_grad=True)
    k = qkv.permute(2, 0, 3, 1, 4)[1]
    got = head_mean(k)
    torch.testing.assert_close(got, k.mean(dim=1), rtol=0, atol=1e-6)
    got.sum().backward()
    torch.testing.assert_close(qkv.grad[:, :, 1], torch.full((2, 7, heads, 8), 1 / heads))
    assert qkv.grad[:, :, 0].abs().sum() == 0
