"""LTMP on Swin (docs/methods.md §2 "On Swin"): thresholds per block applied to every tile for its
MLP, the received attention per token in its (shifted) window, pruned tokens without MLP update,
the training forward equal to inference's, the counted cost model, and GMACs."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer
from vitbench_plugins.ltmp.reduction import LTMPTileReducer, swin_cost_model, swin_kept

import vitbench
from vitbench.engine import TokenState, reduction_context
from vitbench_plugins.swin_family.adapter import SwinAttnInfo, SwinReducingBlock
from vitbench.measure import count_gmacs

pytestmark = pytest.mark.usefixtures("single_thread")

SIZE = 56  # maps 14 (four 7x7 tiles, the second block shifted) and 7 (one tile)


def _swin(embed_dim: int = 16, img_size: int = SIZE) -> SwinTransformer:
    torch.manual_seed(0)
    return SwinTransformer(img_size=img_size, embed_dim=embed_dim, depths=(2, 2), num_heads=(1, 2), window_size=7,
                           num_classes=10, drop_path_rate=0.0).eval()


def _reducers(model):
    return [blk.reducer for stage in model.layers for blk in stage.blocks]


def _set(model, theta_m: float, theta_p: float):
    for r in _reducers(model):
        r.theta_m.data.fill_(theta_m)
        r.theta_p.data.fill_(theta_p)
    return model


def test_thresholds_that_keep_everything_give_the_unpatched_model():
    base = _swin()
    model = _set(vitbench.apply(copy.deepcopy(base), "ltmp"), 1.0, 0.0)  # similarity never > 1; importance > 0
    assert all(isinstance(r, LTMPTileReducer) for r in _reducers(model))
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), base(x), atol=1e-5, rtol=0)  # unfused attention: rounding only
    assert reduction_context(model).token_counts == [49] * 4
    assert [k.tolist() for k in swin_kept(model).values()] == [[1.0] * 8, [1.0] * 8, [1.0] * 2, [1.0] * 2]


@pytest.mark.parametrize("theta_m, theta_p, kept", [
    (-1.0, 0.0, 24),  # every A token (the 25 even positions of a 49-token tile) merges into B
    (1.0, 1.0, 1),    # every token pruned but each tile's most important one
    (-1.0, 1.0, 1),
])
def test_tokens_per_tile_follow_the_thresholds(theta_m, theta_p, kept):
    model = _set(vitbench.apply(_swin(), "ltmp"), theta_m, theta_p)
    with torch.inference_mode():
        out = model(torch.randn(2, 3, SIZE, SIZE))
    assert torch.isfinite(out).all()
    assert reduction_context(model).token_counts == [kept] * 4
    assert all(torch.equal(k, torch.full_like(k, kept / 49)) for k in swin_kept(model).values())


def test_received_attention_is_a_mean_over_each_window_s_queries():
    """Each (shifted) window's probabilities have rows summing to 1, so its tokens' received
    attention sums to 1: a map of 14x14 in 7x7 windows sums to 4 per image, shift or not."""
    model = _set(vitbench.apply(_swin(), "ltmp"), 1.0, 0.0)
    seen = []
    for stage in model.layers:
        for blk in stage.blocks:
            blk.reducer.register_forward_pre_hook(lambda m, args: seen.append(args[2].received))
    with torch.inference_mode():
        model(torch.randn(2, 3, SIZE, SIZE))
    assert [tuple(r.shape) for r in seen] == [(8, 49), (8, 49), (2, 49), (2, 49)]
    for received, windows in zip(seen, (4, 4, 1, 1)):
        torch.testing.assert_close(received.view(2, -1).sum(dim=1), torch.full((2,), float(windows)))
        assert (received > 0).all()


def test_unmerge_gives_merged_tokens_their_destination_and_pruned_ones_nothing():
    """One tile of 4 tokens: A = {0, 2}, B = {1, 3}; 0 merges into 1, 2 does not merge; token 3 is
    pruned. So 0 and 1 take the MLP output of the merged token 1, 2 its own, 3 none."""
    reducer = LTMPTileReducer(0, 0.1, {})
    reducer.theta_m.data.fill_(0.5)
    reducer.theta_p.data.fill_(0.1)
    keys = torch.tensor([[[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [-1.0, -0.2]]])
    received = torch.tensor([[0.3, 0.3, 0.3, 0.05]])
    x = torch.randn(1, 4, 3)
    state = TokenState.start(x, 0, trace_source=True)
    reduced = reducer(x, state, SwinAttnInfo(keys=keys, received=received))
    assert state.size[0, :, 0].tolist() == [0.0, 2.0, 1.0, 0.0]
    torch.testing.assert_close(reduced[0, 1], (x[0, 0] + x[0, 1]) / 2)
    y = torch.where(state.size > 0, reduced * 10.0, torch.zeros_like(reduced))  # the adapter's MLP
    back = reducer.unmerge(y, state)
    torch.testing.assert_close(back[0], torch.stack([y[0, 1], y[0, 1], y[0, 2], torch.zeros(3)]))


def test_training_masks_the_mlp_output_like_inference_removes_it_and_trains_the_thresholds():
    model = _set(vitbench.apply(_swin(), "ltmp"), 0.2, 0.02)
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.inference_mode():
        inference = model(x)
    counts = reduction_context(model).token_counts
    assert 1 < min(counts) and max(counts) < 49  # some tokens merged or pruned in every block
    stage = reduction_context(model).reduction.train[0]
    model.train()
    labels = torch.tensor([1, 2])
    logits = model(x)
    torch.testing.assert_close(logits, inference, atol=1e-5, rtol=1e-4)  # the straight-through forward
    penalty = stage.extra_loss(model, logits, labels)
    ratio = reduction_context(model).extras["ltmp_flops_ratio"]
    assert 0.5 < float(ratio) < 1.0
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1) + penalty
    assert torch.isfinite(loss)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if ".reducer." in n}
    assert set(grads) == {f"layers.{s}.blocks.{b}.reducer.{t}" for s in (0, 1) for b in (0, 1)
                          for t in ("theta_m", "theta_p")}
    assert all(g is not None and torch.isfinite(g) for g in grads.values())
    assert any(g.abs() > 0 for n, g in grads.items() if n.endswith("theta_m"))
    assert any(g.abs() > 0 for n, g in grads.items() if n.endswith("theta_p"))
    assert stage.extra_loss(model, logits, labels) is None  # the masks of that forward are used up
    model.eval()


@pytest.mark.parametrize("img_size", [56, 64])  # 64: maps 16 and 8, padded windows, tiles of 8x8
def test_the_cost_model_is_the_counted_gmacs(img_size):
    base = _swin(img_size=img_size)
    images = torch.randn(1, 3, img_size, img_size)
    assert swin_cost_model(base, [False] * 4).full == pytest.approx(count_gmacs(base, images).mean * 1e9)
    model = _set(vitbench.apply(copy.deepcopy(base), "ltmp"), 0.2, 0.02)
    counted = count_gmacs(model, images).mean * 1e9
    kept = [float(k.mean()) for k in swin_kept(model).values()]
    assert min(kept) < 1.0
    assert swin_cost_model(model, [True] * 4).macs(kept) == pytest.approx(counted, abs=0.5)  # float32 fractions


def test_gmacs_fall_and_state_dict_keys_stay_timm_s():
    base = _swin(embed_dim=96)
    model = _set(vitbench.apply(copy.deepcopy(base), "ltmp"), 0.2, 0.02)
    assert [k for k in model.state_dict() if ".reducer." not in k] == list(base.state_dict())
    images = torch.randn(1, 3, SIZE, SIZE)
    assert count_gmacs(model, images).mean < 0.95 * count_gmacs(base, images).mean
    assert any(isinstance(m, SwinReducingBlock) for m in model.modules())


@pytest.mark.slow
def test_swin_tiny_gmacs():
    """swin_tiny_patch4_window7_224, random weights: the thresholds' initialisation (0.9, 0) merges
    almost nothing on random keys (4.49 -> 4.50 with the matching); the paper's LTMP-Swin-T row
    (3.95 G) is 0.88 of the baseline: ``target``/``--match-gmacs`` 0.88 after fine-tuning."""
    from vitbench.measure.flops import count_gmacs_at

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    base = count_gmacs_at(model).mean
    reduced = vitbench.apply(model, "ltmp")
    assert base == pytest.approx(4.49, abs=0.01)
    assert count_gmacs_at(reduced).mean == pytest.approx(base, abs=0.05)
    assert swin_cost_model(reduced, [True] * 12).full / 1e9 == pytest.approx(base, abs=1e-6)


def test_pruned_tokens_get_the_same_zero_update_inside_device_only():
    """Under --cuda-graph (device_only) the MLP runs on every token and the removed ones' outputs
    are zeroed instead of packing the kept ones: the same logits, with static shapes."""
    from vitbench.engine.host_sync import device_only

    model = _set(vitbench.apply(_swin(), "ltmp"), -1.0, 0.5)  # some tokens merged, some pruned
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.inference_mode():
        packed = model(x)
        with device_only():
            static = model(x)
    torch.testing.assert_close(static, packed, atol=1e-5, rtol=0)
