"""DynamicViT (plugins/dynamicvit/): learned keep predictors, masked in training, top-k at inference."""
from __future__ import annotations

import math

import pytest
import timm
import torch

import vitbench
from vitbench.engine import TokenState, enable_source_tracing, reduction_context, unmerge
from vitbench.engine.attention import AttnInfo, attention_forward
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench.host import get_host
from vitbench.testing import check_method, tiny_deit_distilled, tiny_vit
from vitbench_plugins.dynamicvit import DynamicViTParams
from vitbench_plugins.dynamicvit.reduction import DynamicViTReducer, KeepPredictor, key_bias_of, stage_count

LAYERS = (1, 3, 5)  # test_vit has 6 blocks


def _test_vit():
    torch.manual_seed(0)
    return timm.create_model("test_vit", pretrained=False).eval()


def _images(n=2, size=160, seed=0):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _reducers(model):
    return [m for m in model.modules() if isinstance(m, DynamicViTReducer)]


def _stage(model):
    return reduction_context(model).reduction.train[0]


def _stage_masks(model):
    """Record every stage's patch mask of the next training forward (hooks on the reducers)."""
    masks = {}

    def hook(module, args, out):
        masks[module.stage] = args[1].private["dynamicvit_mask"].detach().clone()

    handles = [r.register_forward_hook(hook) for r in _reducers(model)]
    return masks, handles


# -- registration and parameters ---------------------------------------------------------------


def test_registers_as_a_learnable_pruning_method():
    spec = get_host().method("dynamicvit")
    assert spec.kind == "pruning" and spec.needs_training and spec.needs == {"token_steps", "one_width"}
    assert get_host().families_for(spec) == ["vit"]
    assert spec.budget.param == "keep" and spec.budget.larger_means == "more"
    model = vitbench.apply(tiny_vit(), "dynamicvit")
    assert [r.stage for r in _reducers(model)] == [1, 2, 3]
    assert [b.index for b in model.blocks if b.reducer is not None] == [3, 6, 9]
    assert all(b.fused for b in model.blocks)  # no attention probabilities asked for
    stage = _stage(model)
    assert stage.optimizer == "AdamW" and stage.lr == 1e-2 and stage.epochs == 1
    assert stage.trainable == ("predictor",) and stage.schedule == "cosine"
    assert not any(r.training for r in _reducers(model))  # applied to an eval model: inference


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0.0}, r"dynamicvit.keep=0.0 is out of range; it must be in \(0, 1\]"),
    ({"keep": 1.5}, r"dynamicvit.keep=1.5 is out of range"),
    ({"layers": ()}, r"dynamicvit.layers=\[\] is out of range; it must list at least one block"),
    ({"layers": (-1,)}, r"every item must be >= 0"),
    ({"layers": (3, 3)}, r"each block may be listed once"),
    ({"ratio_weight": -1.0}, r"dynamicvit.ratio_weight=-1.0 is out of range; it must be >= 0"),
    ({"tau": 0.0}, r"dynamicvit.tau=0.0 is out of range; it must be > 0 \(the temperature\)"),
    ({"epochs": 0}, r"dynamicvit.epochs=0 is out of range; it must be >= 1"),
    ({"lr": 0.0}, r"dynamicvit.lr=0.0 is out of range; it must be > 0"),
    ({"batch_size": 0}, r"dynamicvit.batch_size=0 is out of range; it must be >= 1"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("dynamicvit", DynamicViTParams, kwargs)  # what the command line, the plan and apply go through


def test_a_block_the_model_lacks_is_a_param_error():
    with pytest.raises(ParamError, match=r"dynamicvit.layers contains 6; valid block indices for this model: 0..5"):
        vitbench.apply(_test_vit(), "dynamicvit", layers=(3, 6, 9))  # 12 blocks' schedule on a 6-block model


def test_the_default_blocks_scale_to_a_6_block_model():
    reduced = vitbench.apply(_test_vit(), "dynamicvit")
    assert [i for i, b in enumerate(reduced.blocks) if b.reducer is not None] == [1, 3, 4]


# -- inference: fixed counts, top-k by the keep probability ------------------------------------


def test_stage_counts_are_ceil_rho_to_the_s_of_the_patches():
    assert [stage_count(0.7, s, 100) for s in (1, 2, 3)] == [70, 49, 35]  # 0.7^2*100 = 48.999...
    assert [stage_count(0.7, s, 196) for s in (1, 2, 3)] == [138, 97, 68]  # DeiT-S
    assert [stage_count(0.7, s, 64) for s in (1, 2, 3)] == [45, 32, 22]
    assert [stage_count(1.0, s, 64) for s in (1, 2, 3)] == [64, 64, 64]
    assert stage_count(0.001, 3, 64) == 1


def test_untrained_predictor_keeps_exactly_the_stage_counts_on_test_vit():
    model = vitbench.apply(_test_vit(), "dynamicvit", layers=LAYERS)
    with torch.inference_mode():
        out = model(_images())
    assert torch.isfinite(out).all()
    ctx = reduction_context(model)
    assert ctx.token_counts == [101, 1 + 70, 1 + 70, 1 + 49, 1 + 49, 1 + 35]
    assert ctx.state.size is None  # pruning never merges
    assert ctx.state.key_bias is None  # no mask at inference


def test_counts_on_tiny_models_with_the_defaults():
    model = vitbench.apply(tiny_vit(), "dynamicvit")
    with torch.inference_mode():
        model(torch.randn(2, 3, 32, 32))
    assert reduction_context(model).token_counts == [65] * 3 + [46] * 3 + [33] * 3 + [23] * 3
    model = vitbench.apply(tiny_deit_distilled(), "dynamicvit", keep=0.5)  # cls + dist stay
    with torch.inference_mode():
        model(torch.randn(2, 3, 32, 32))
    assert reduction_context(model).token_counts == [66] * 3 + [34] * 3 + [18] * 3 + [10] * 3


class _ScoreByChannel0(torch.nn.Module):
    """A stand-in predictor: keep log-probability = channel 0 of each token."""

    def forward(self, x, mask=None):
        keep = torch.nn.functional.logsigmoid(x[..., 0])
        drop = torch.nn.functional.logsigmoid(-x[..., 0])
        return torch.stack([drop, keep], dim=-1)


def test_inference_keeps_the_most_likely_tokens_in_their_order():
    """Prefix token, then patch scores [0.1, 0.9, -1, 0.5, 0.9, 0.2]; keep 0.5 of 6 at stage 1
    keeps 3: scores 0.9 (pos 2), 0.9 (pos 5), 0.5 (pos 4), laid out in position order."""
    reducer = DynamicViTReducer(stage=1, dim=4, keep=0.5, tau=1.0)
    reducer.predictor = _ScoreByChannel0()
    scores = torch.tensor([7.0, 0.1, 0.9, -1.0, 0.5, 0.9, 0.2])  # position 0: the class token
    x = torch.zeros(1, 7, 4)
    x[0, :, 0] = scores
    x[0, :, 1] = torch.arange(7.0)  # identifies each token
    state = TokenState(prefix=1)
    out = reducer(x, state, AttnInfo())
    assert out[0, :, 1].tolist() == [0.0, 2.0, 4.0, 5.0]


def test_keep_one_equals_the_unpatched_model_in_eval_and_training():
    base = _test_vit()
    x = _images()
    with torch.inference_mode():
        expected = base(x)
    model = vitbench.apply(_test_vit(), "dynamicvit", keep=1.0, layers=LAYERS)
    with torch.inference_mode():
        assert torch.equal(model(x), expected)
    model.train()
    base.train()
    with torch.no_grad():  # test_vit has no dropout: training mode computes the same
        assert (model(x) - base(x)).abs().max() < 1e-5
    assert reduction_context(model).state.key_bias is None


def test_global_feature_is_the_mean_over_the_kept_tokens():
    """Changing a masked token changes no other token's keep log-probabilities; changing a kept
    one changes them all (through the global feature)."""
    torch.manual_seed(0)
    pred = KeepPredictor(8)
    x = torch.randn(1, 5, 8)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    base = pred(x, mask)
    y = x.clone()
    y[0, 1] += 3.0 * torch.randn(8)  # masked (not a constant shift: the LayerNorm removes those)
    moved = pred(y, mask)
    others = [0, 2, 3, 4]
    assert torch.equal(moved[0, others], base[0, others])
    y = x.clone()
    y[0, 2] += 3.0 * torch.randn(8)  # kept
    assert not torch.allclose(pred(y, mask)[0, [0, 3]], base[0, [0, 3]])
    assert torch.allclose(base.exp().sum(-1), torch.ones(1, 5))  # log-probabilities of keep/drop


def test_source_tracing_unmerges_to_the_full_grid():
    model = enable_source_tracing(vitbench.apply(_test_vit(), "dynamicvit", layers=LAYERS))
    with torch.inference_mode():
        feats = model.forward_features(_images())
    state = reduction_context(model).state
    assert feats.shape[1] == 36
    assert unmerge(feats, state).shape == (2, 101, 64)


# -- training: hard masks, attention masking, the ratio loss ----------------------------------


def test_training_masks_are_hard_nested_and_their_ratio_loss_is_the_papers():
    model = vitbench.apply(_test_vit(), "dynamicvit", layers=LAYERS).train()
    masks, handles = _stage_masks(model)
    torch.manual_seed(1)
    logits = model(_images(4))
    for h in handles:
        h.remove()
    ctx = reduction_context(model)
    assert ctx.token_counts == [101] * 6  # masked, not removed
    assert sorted(masks) == [1, 2, 3]
    for s in (1, 2, 3):
        assert masks[s].shape == (4, 100)
        assert set(masks[s].unique().tolist()) <= {0.0, 1.0}
    assert bool((masks[2] <= masks[1]).all()) and bool((masks[3] <= masks[2]).all())  # D = D^ * decision
    bias = ctx.state.key_bias
    assert bias.shape == (4, 1, 1, 101)
    assert bool((bias[..., 0] == 0).all())  # the class token is always attended
    assert torch.equal(bias[:, 0, 0, 1:] < -20, masks[3] == 0)
    penalty = _stage(model).extra_loss(model, logits, None)
    by_hand = sum(((masks[s].mean(dim=1) - 0.7 ** s) ** 2).mean() for s in (1, 2, 3)) / 3
    assert abs(float(penalty) - 2.0 * float(by_hand)) < 1e-6
    assert abs(float(ctx.extras["dynamicvit_ratio_loss"]) - float(by_hand)) < 1e-6
    assert set(ctx.extras["dynamicvit_kept"]) == {1, 2, 3}


def test_a_masked_token_gets_no_attention():
    """One block's attention with the training key mask: the outputs of the other tokens do not
    change when a masked token's value changes, and do when a kept token's does."""
    model = _test_vit()
    blk = model.blocks[2]
    x = torch.randn(2, 101, 64, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 100)
    mask[:, 10] = 0.0  # token 11 (after the class token) is masked
    bias = key_bias_of(mask, 1)
    with torch.no_grad():
        out, _ = attention_forward(blk.attn, x, bias)
        moved = x.clone()
        moved[:, 11] += 5.0 * torch.randn(2, 64)
        out2, _ = attention_forward(blk.attn, moved, bias)
        others = [i for i in range(101) if i != 11]
        assert (out2[:, others] - out[:, others]).abs().max() < 1e-6
        kept = x.clone()
        kept[:, 12] += 5.0 * torch.randn(2, 64)
        out3, _ = attention_forward(blk.attn, kept, bias)
        assert (out3[:, others] - out[:, others]).abs().max() > 1e-3


def test_dropped_tokens_do_not_reach_the_logits_in_training():
    """Overwrite the tokens stage 1 dropped right after it: same noise, same masks, same logits."""
    model = vitbench.apply(_test_vit(), "dynamicvit", layers=LAYERS).train()
    x = _images()
    torch.manual_seed(3)
    expected = model(x).detach()

    def scramble(module, args, out):
        dropped = args[1].private["dynamicvit_mask"] == 0  # [B, N_p]
        noise = 10.0 * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        return out + noise * torch.cat([torch.zeros_like(dropped[:, :1]), dropped], 1)[..., None]

    handle = _reducers(model)[0].register_forward_hook(scramble)
    torch.manual_seed(3)
    got = model(x).detach()
    handle.remove()
    assert (got - expected).abs().max() < 1e-5


def test_the_cross_entropy_reaches_every_predictor_through_the_attention_mask():
    model = vitbench.apply(_test_vit(), "dynamicvit", layers=LAYERS).train()
    torch.manual_seed(0)
    logits = model(_images())
    torch.nn.functional.cross_entropy(logits, torch.tensor([1, 2])).backward()
    first, second, last = _reducers(model)
    for r in (first, second):
        grads = [p.grad for p in r.predictor.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0
    # stage 3 sits in the last block: no attention follows, so only the ratio loss trains it
    assert all(p.grad is None for p in last.predictor.parameters())


def test_a_few_steps_reduce_the_ratio_loss():
    model = vitbench.apply(tiny_vit(), "dynamicvit")
    stage = _stage(model)
    params = [p for r in _reducers(model) for p in r.predictor.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:  # only the predictors train (vitbench's default: the backbone is frozen)
        p.requires_grad_(True)
    opt = torch.optim.SGD(params, lr=0.5)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))

    def ratio_loss(draws=3):
        with torch.no_grad():
            total = 0.0
            for _ in range(draws):
                logits = model(x)
                total += float(stage.extra_loss(model, logits, None))
            return total / draws

    model.train()
    torch.manual_seed(0)
    before = ratio_loss()
    for _ in range(10):
        logits = model(x)
        loss = stage.extra_loss(model, logits, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = ratio_loss()
    assert after < 0.5 * before, (before, after)
    model.eval()
    with torch.inference_mode():
        model(x)
    assert reduction_context(model).token_counts[-1] == 23  # counts never depend on training


# -- conformance --------------------------------------------------------------------------------


def test_conforms():
    report = check_method("dynamicvit")
    assert report.token_counts == [65] * 3 + [46] * 3 + [33] * 3 + [23] * 3
    report = check_method("dynamicvit", {"keep": 0.5, "layers": (1, 2)})
    assert report.token_counts == [65, 33] + [17] * 10


def test_fewer_gmacs_than_the_baseline():
    from vitbench.measure import count_gmacs

    x = torch.randn(1, 3, 32, 32)
    base = count_gmacs(tiny_vit(), x).mean
    reduced = count_gmacs(vitbench.apply(tiny_vit(), "dynamicvit"), x).mean
    same = count_gmacs(vitbench.apply(tiny_vit(), "dynamicvit", keep=1.0), x).mean
    assert reduced < base and same == base
    assert math.isfinite(reduced)
