"""The Swin family adapter on timm's Swin V2 (``SwinTransformerV2``: post-norm blocks, scaled
cosine attention, continuous position bias): the re-run V2 window attention equal to timm's
(shifted and padded maps, dynamic masks, both qkv bias layouts), what it hands a reducer, the
post-norm MLP step with the unmerge, switched-off equality, checkpoints, DCS's hooks, LTMP's
cost model, the det/seg pyramid and the published GMACs of SwinV2-T/B."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer_v2 import SwinTransformerV2

import vitbench
from vitbench.catalog import Reduction
from vitbench.engine import Reducer, bipartite_soft_matching, reduction_context
from vitbench_plugins.swin_family.adapter import SwinReducingBlock, describe, patch, unmerge_mlp
from vitbench.measure import count_gmacs


@pytest.fixture(autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _small(img_size: int = 64, window: int = 8, **kwargs) -> SwinTransformerV2:  # type: ignore[no-untyped-def]
    """Two stages of two blocks (the second shifted where the map exceeds the window). timm
    starts every post-norm at weight 0 (each block the identity); the norms, biases and logit
    scales are randomised so that every part of the block shows in its output."""
    torch.manual_seed(0)
    model = SwinTransformerV2(img_size=img_size, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=window,
                              num_classes=10, **kwargs).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm" in name or name.endswith("bias") or "logit_scale" in name:
                p.normal_(0.0, 0.5).add_(1.0 if name.endswith("weight") else 0.0)
    return model


class _Identity(Reducer):
    """Keeps every token and checks what the attention handed over."""

    needs = frozenset({"keys", "received_attn"})

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        assert info.keys is not None and info.keys.shape[:2] == x.shape[:2]
        assert info.received is not None and info.received.shape == x.shape[:2]
        return x


@pytest.mark.parametrize("img_size, window, kwargs", [
    (64, 8, {}),                               # maps 16 (two windows a side, shifted) and 8 (one window)
    (72, 8, {}),                               # maps 18 and 9: padded windows, shifted, in both stages
    (56, 7, {"qkv_bias": False}),              # no q/v bias: qkv alone
    (72, 8, {"dynamic_img_size": True}),       # the shifted-window mask built in the forward
])
def test_a_reducer_that_keeps_everything_is_timm(img_size, window, kwargs):
    model = _small(img_size, window, **kwargs)
    x = torch.randn(2, 3, img_size, img_size)
    with torch.inference_mode():
        ref = model(x)
        out = patch(copy.deepcopy(model), Reduction([_Identity()] * 4))(x)
    assert torch.equal(out, ref)


def test_the_separate_qkv_bias_layout_is_timm():
    model = _small(72)
    for m in model.modules():
        if hasattr(m, "qkv_bias_separate"):
            m.qkv_bias_separate = True
    x = torch.randn(2, 3, 72, 72)
    with torch.inference_mode():
        ref = model(x)
        out = patch(copy.deepcopy(model), Reduction([_Identity()] * 4))(x)
    assert (out - ref).abs().max().item() < 1e-6


class _ScaleQK(Reducer):
    """A Q/K hook that scales every query and key: the cosine attention must not see it (the
    hook runs before the normalisation); a hook that zeroes channels gives the cosine of the
    others."""

    needs: frozenset = frozenset()

    def __init__(self, scale: float = 1.0, drop: int = 0) -> None:
        self.scale, self.drop, self.calls = scale, drop, 0

    def qk(self, q, k, x):  # type: ignore[no-untyped-def]
        self.calls += 1
        mask = torch.ones(q.shape[-1])
        mask[:self.drop] = 0.0
        return q * self.scale * mask, k * self.scale * mask

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        return x


def test_the_qk_hook_runs_before_the_cosine_normalisation():
    model = _small(72)
    x = torch.randn(2, 3, 72, 72)
    hooks = [_ScaleQK(scale=5.0) for _ in range(4)]
    with torch.inference_mode():
        ref = model(x)
        scaled = patch(copy.deepcopy(model), Reduction(hooks))(x)
    assert all(h.calls == 1 for h in hooks) and (scaled - ref).abs().max().item() < 1e-5
    block = copy.deepcopy(model.layers[0].blocks[0])  # map 18, window 8: padded windows
    with torch.no_grad():  # q and k without their first 6 of 16 channels (one head)
        block.attn.qkv.weight[:6] = 0.0
        block.attn.qkv.weight[16:22] = 0.0
        block.attn.q_bias[:6] = 0.0
    dropped = patch(copy.deepcopy(model), Reduction([_ScaleQK(drop=6), None, None, None]))
    with torch.inference_mode():  # the hook's mask = the cosine of the other 10 channels
        by_hand = block(model.patch_embed(x))
        out = dropped.layers[0].blocks[0](dropped.patch_embed(x))
        whole = model.layers[0].blocks[0](model.patch_embed(x))
    assert (out - by_hand).abs().max().item() < 1e-5 and (out - whole).abs().max().item() > 1e-3


class _Record(Reducer):
    needs = frozenset({"keys", "received_attn"})

    def __init__(self) -> None:
        self.seen: list = []

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        self.seen.append((x, info))
        return x


def test_keys_are_the_head_mean_of_the_unit_keys_and_received_attention_is_a_window_mean():
    """Block 0 (map 16, window 8, no shift: tiles = windows): ``keys`` is ``mean_h k_h/||k_h||``
    from timm's own qkv and biases; every window's received attention adds up to 1 (the mean of
    its queries' rows). Block 1 (shifted): the map's received attention adds up to its 4 windows."""
    model = _small(64)
    recorders = [_Record(), _Record(), None, None]
    patched = patch(copy.deepcopy(model), Reduction(recorders))
    images = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        patched(images)
        x = model.patch_embed(images)
        attn = model.layers[0].blocks[0].attn
        windows = x.view(2, 2, 8, 2, 8, 16).permute(0, 1, 3, 2, 4, 5).reshape(8, 64, 16)
        bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        k = F.linear(windows, attn.qkv.weight, bias).reshape(8, 64, 3, 1, 16)[:, :, 1].transpose(1, 2)
        expected = F.normalize(k, dim=-1).mean(dim=1)
    (_, info0), = recorders[0].seen
    assert (info0.keys - expected).abs().max().item() < 1e-6
    assert torch.allclose(info0.received.sum(dim=-1), torch.ones(8), atol=1e-5)
    (_, info1), = recorders[1].seen
    assert torch.allclose(info1.received.view(2, -1).sum(dim=-1), torch.full((2,), 4.0), atol=1e-4)


class _Merge(Reducer):
    """ToMe's bipartite matching on the handed-over keys (``r`` per tile), remembering its
    input, output and state for the post-norm oracle."""

    needs = frozenset({"keys"})

    def __init__(self, r: int) -> None:
        self.r, self.seen = r, None

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        merged = state.merge(x, bipartite_soft_matching(info.keys, self.r, 0))
        self.seen = (x, merged, state)
        return merged


def test_the_post_norm_mlp_step_is_norm2_of_the_unmerged_mlp_output():
    """``x + norm2(unmerge(mlp(merged)))`` by hand (the post-norm form, norm2 on every token
    after the unmerge) equals the block, which runs norm2 on the merged tokens before the
    unmerge: norm2 is per token and the unmerge copies tokens."""
    model = _small(64)
    merge = _Merge(r=20)
    patched = patch(copy.deepcopy(model), Reduction([merge, None, None, None]))
    outputs = []
    patched.layers[0].blocks[0].register_forward_hook(lambda m, a, out: outputs.append(out))
    with torch.inference_mode():
        patched(torch.randn(2, 3, 64, 64))
        tokens, merged, state = merge.seen
        blk = model.layers[0].blocks[0]
        expected = tokens + blk.norm2(unmerge_mlp(blk.mlp(merged), state))
    out = outputs[0].view(2, 2, 8, 2, 8, 16).permute(0, 1, 3, 2, 4, 5).reshape(8, 64, 16)
    assert merged.shape == (8, 44, 16)
    assert (out - expected).abs().max().item() < 1e-5


def test_r_zero_is_the_unpatched_model_and_tome_reduces_every_tile():
    model = _small(64)
    x = torch.randn(2, 3, 64, 64)
    off = vitbench.apply(copy.deepcopy(model), "tome", r=0)
    reduced = vitbench.apply(copy.deepcopy(model), "tome", r=10)
    with torch.inference_mode():
        assert torch.equal(off(x), model(x))
        out = reduced(x)
    ctx = reduction_context(reduced)
    assert ctx.token_counts == [54, 54, 54, 54]  # tiles of 8x8 = 64 tokens
    assert torch.equal(ctx.state.size.sum(dim=1), torch.full((2, 1), 64.0))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_describe_and_checkpoints_keep_timm_keys():
    model = _small(72)
    info = describe(model)
    assert info.family == "swin" and info.depth == 4 and [b.grid for b in info.blocks] == [(9, 9)] * 2 + [(9, 9)] * 2
    reduced = vitbench.apply(copy.deepcopy(model), "tome", r=4)
    assert any(isinstance(m, SwinReducingBlock) for m in reduced.modules())
    assert list(reduced.state_dict()) == list(model.state_dict())
    reduced.load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("method, params", [("tofu", {"r": 8}), ("pitome", {"r": 8}), ("ltm", {}), ("ltmp", {})])
def test_the_other_swin_methods_run(method, params):
    """Every token method of the swin family runs on V2 (counts per 64-token tile, finite
    outputs; on a 16-wide model their matching can cost more than it saves). LTMP's cost model
    (its target on Swin) is the counted GMACs, the V2 position-bias MLP included (it runs once
    per relative offset, not per token)."""
    from vitbench_plugins.ltmp.reduction import swin_cost_model, swin_kept

    base = _small(64)
    model = vitbench.apply(copy.deepcopy(base), method, **params)
    x = torch.randn(1, 3, 64, 64)
    if method == "ltmp":
        for reducer in (m.reducer for m in model.modules() if isinstance(m, SwinReducingBlock)):
            reducer.theta_m.data.fill_(0.2)  # thresholds that merge and prune (as test_ltmp_swin.py's)
            reducer.theta_p.data.fill_(0.02)
    with torch.inference_mode():
        out = model(x)
    assert torch.isfinite(out).all() and max(reduction_context(model).token_counts) <= 64
    counted = count_gmacs(model, x).mean * 1e9
    if method == "ltmp":
        assert swin_cost_model(base, [False] * 4).full == pytest.approx(count_gmacs(base, x).mean * 1e9)
        kept = [float(k.mean()) for k in swin_kept(model).values()]
        assert min(kept) < 1.0
        assert swin_cost_model(model, [True] * 4).macs(kept) == pytest.approx(counted, abs=0.5)


def test_ltmp_training_masks_the_post_norm_branch_like_inference_removes_tokens():
    """LTMP's training forward (masks on the unmerged branch output ``norm2(mlp(x))``) equals
    its inference forward (pruned tokens out of the MLP, merged ones copied): the post-norm is
    per token, so masking after it is removing before it."""
    model = vitbench.apply(_small(64, drop_path_rate=0.0), "ltmp")
    for reducer in (m.reducer for m in model.modules() if isinstance(m, SwinReducingBlock)):
        reducer.theta_m.data.fill_(0.9)  # some tokens merged or pruned in every block, not all
        reducer.theta_p.data.fill_(0.005)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        inference = model(x)
    assert 1 < min(reduction_context(model).token_counts) and max(reduction_context(model).token_counts) < 64
    model.train()
    training = model(x)
    model.eval()
    torch.testing.assert_close(training, inference, atol=1e-5, rtol=1e-4)


def test_dcs_untrained_is_timm_and_the_shrunk_mlps_equal_the_gated_ones():
    """DCS's Q/K hook runs on the raw queries and keys of every window (before the cosine
    normalisation), its MLP hook on the whole map with norm2 after it: untrained it keeps every
    channel (timm's output exactly); with random masks and gates the shrunk model equals the
    gated one, and the budget's cost model equals the counted GMACs before and after."""
    from vitbench_plugins.dcs.reduction import dcs_reducers

    base = _small(64)
    model = vitbench.apply(copy.deepcopy(base), "dcs", arch="both", budget=1.0)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for reducer in dcs_reducers(model):
            for lin in (m for m in reducer.qk_mask.modules() if isinstance(m, torch.nn.Linear)):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g))
                lin.bias.copy_(torch.randn(lin.bias.shape, generator=g))
            reducer.mlp_gate.alpha.copy_(torch.randn(reducer.mlp_gate.alpha.shape, generator=g))
    with torch.inference_mode():
        masked = model(x)
    assert not torch.equal(masked, base(x))
    one = x[:1]
    search = next(s for s in reduction_context(model).reduction.train if s.name == "search")
    for callback in search.before:
        callback(model, lambda: iter([(one, torch.zeros(1, dtype=torch.long))]))
    cost = dcs_reducers(model)[0].compute_budget
    assert cost.current() / 1e9 == pytest.approx(count_gmacs(model, one).mean, rel=1e-6)
    search.after[0](model)
    assert all(r.kept is not None for r in dcs_reducers(model))
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5
    assert cost.current() / 1e9 == pytest.approx(count_gmacs(model, one).mean, rel=1e-6)


def test_the_stages_are_the_det_seg_pyramid():
    from vitbench.tasks.dense.backbone import FeatureMaps

    torch.manual_seed(0)
    model = SwinTransformerV2(img_size=128, embed_dim=16, depths=(1, 1, 2, 2), num_heads=(1, 2, 2, 4),
                              window_size=8, num_classes=3).eval()
    x = torch.randn(2, 3, 128, 128)
    with torch.inference_mode():
        full = FeatureMaps(model, (16, 32))(x)
        merged = FeatureMaps(vitbench.apply(copy.deepcopy(model), "tome", r=8), (16, 32))(x)
    assert [tuple(m.shape) for m in full] == [(2, 64, 8, 8), (2, 128, 4, 4)]
    assert [m.shape for m in merged] == [m.shape for m in full] and all(torch.isfinite(m).all() for m in merged)


@pytest.mark.slow
@pytest.mark.parametrize("name, baseline, r, tome", [
    ("swinv2_tiny_window8_256", 5.94, 16, 5.04),    # official Swin repo: SwinV2-T 256px window 8: 5.9 G
    ("swinv2_tiny_window16_256", 6.66, 16, 6.35),   # SwinV2-T window 16: 6.6 G (the paper's table)
    ("swinv2_base_window8_256", 20.33, 16, 17.11),  # SwinV2-B window 8: 20.3 G
])
def test_swinv2_gmacs(name, baseline, r, tome):
    """Random weights, 256 px: the baselines match the published FLOPs (multiply-accumulates) of
    the official Swin repository; ToMe's ``r`` per 64-token (window 8) or 256-token (window 16)
    tile saves MLP MACs."""
    from vitbench.measure.flops import count_gmacs_at

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    assert count_gmacs_at(model, (3, 256, 256)).mean == pytest.approx(baseline, abs=0.01)
    assert count_gmacs_at(vitbench.apply(model, "tome", r=r), (3, 256, 256)).mean == pytest.approx(tome, abs=0.01)
