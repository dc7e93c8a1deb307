"""LTM / IBTM (docs/methods.md §5, §6): shapes, the pooling initialisation, the IB step, the
statistics of Algorithm 1, training mechanics and checkpoints."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from vitbench_plugins.ltm.reduction import FirstMerge, ReMerge, ib_mask_step, soft_merge

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.engine.grid_merge import square_merge_grid as vit_merge_grid
from vitbench.errors import ParamError
from vitbench.measure import count_gmacs
from vitbench.measure.ib import (
    class_centroids,
    final_features,
    input_vectors,
    log_q_given_y,
    soft_assign,
)
from vitbench.host import get_host
from vitbench.testing import check_method, tiny_vit

P = 45  # ceil(0.7 * 64)


def _data(n_batches: int = 1, batch: int = 20, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(batch, 3, 32, 32, generator=g), torch.arange(batch) % 10) for _ in range(n_batches)]
    return lambda: iter(data)


def _ltm(seed: int = 0, stats: bool = True, **params):
    model = vitbench.apply(tiny_vit(seed), "ltm", **params)
    if stats:
        _stage(model).before[0](model, _data())
    return model


def _stage(model):
    return reduction_context(model).reduction.train[0]


def _reducers(model):
    return [blk.reducer for blk in model.blocks]


def _train_step(model, images, labels):
    """One loss as the fine-tuning loop computes it: labels in the context, CE + extra loss."""
    ctx = reduction_context(model)
    ctx.labels = labels
    try:
        logits = model(images)
        return F.cross_entropy(logits, labels) + _stage(model).extra_loss(model, logits, labels)
    finally:
        ctx.labels = None


def test_64_patches_at_ratio_07_carry_45_tokens_through_every_block():
    model = _ltm(stats=False)
    assert vit_merge_grid(get_host().family_of(model).describe(model), 0.7) == (P, (7, 7))
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert reduction_context(model).token_counts == [1 + P] * 12
    size = reduction_context(model).state.size
    torch.testing.assert_close(size[:, 1:].sum(dim=1), torch.full((2, 1), 64.0), rtol=1e-5, atol=0)  # keep 64 patches
    assert torch.equal(size[:, :1], torch.ones(2, 1, 1))  # cls untouched
    assert check_method("ltm").token_counts == [1 + P] * 12


@pytest.mark.parametrize("ratio, side", [(0.7, 7), (0.5, 6), (1.0, 8)])
def test_untrained_first_mask_equals_average_pooling(ratio, side):
    first = _reducers(_ltm(stats=False, ratio=ratio, init="grid"))[0]
    assert isinstance(first, FirstMerge)
    x = torch.randn(2, 1 + 64, 48)
    with torch.no_grad():
        out = first(x, TokenState.start(x, 1), AttnInfo())
    p = math.ceil(ratio * 64 - 1e-9)
    # independently: adaptive average pooling of the 8x8 grid to side x side, p cells spread evenly
    grid = x[:, 1:].transpose(1, 2).reshape(2, 48, 8, 8)
    pooled = F.adaptive_avg_pool2d(grid, side).flatten(2).transpose(1, 2)  # [B, side^2, C]
    cells = [math.floor(i * (side * side - 1) / max(p - 1, 1) + 0.5) for i in range(p)]
    assert len(set(cells)) == p
    assert torch.equal(out[:, :1], x[:, :1])  # the prefix token is kept aside, untouched
    torch.testing.assert_close(out[:, 1:], pooled[:, cells], atol=2e-3, rtol=0)  # leak e^-12 per patch


@pytest.mark.parametrize("ratio", [0.7, 0.5, 0.3, 1.0])
def test_untrained_first_mask_by_default_averages_runs_of_neighbouring_patches(ratio):
    first = _reducers(_ltm(stats=False, ratio=ratio))[0]
    x = torch.randn(2, 1 + 64, 48)
    with torch.no_grad():
        out = first(x, TokenState.start(x, 1), AttnInfo())
    p = math.ceil(ratio * 64 - 1e-9)
    # independently: the 64 patches along the snake path (rows alternate direction) are cut at
    # round(i * 64 / p) into p runs; each merged token is the mean of its run, tokens ordered by
    # their run's first patch in raster order
    path = [r * 8 + (c if r % 2 == 0 else 7 - c) for r in range(8) for c in range(8)]
    cuts = [math.floor(i * 64 / p + 0.5) for i in range(p + 1)]
    runs = sorted((path[cuts[i]:cuts[i + 1]] for i in range(p)), key=min)
    assert sorted(len(run) for run in runs) == sorted([64 // p] * (p - 64 % p) + [64 // p + 1] * (64 % p))
    for run in runs:  # consecutive patches of a run are grid neighbours
        for a, b in zip(run, run[1:]):
            assert abs(a // 8 - b // 8) + abs(a % 8 - b % 8) == 1
    expected = torch.stack([x[:, 1:][:, run].mean(dim=1) for run in runs], dim=1)
    assert torch.equal(out[:, :1], x[:, :1])
    torch.testing.assert_close(out[:, 1:], expected, atol=2e-3, rtol=0)  # leak e^-12 per patch
    if ratio == 1.0:
        torch.testing.assert_close(out, x, atol=2e-3, rtol=0)  # the identity (same leak)


def test_sizes_carry_no_gradient_so_an_ignored_token_cannot_blow_up_the_masks():
    """The divergence of issue 9: a token whose row of G is ~0 (every merged token learned to
    ignore it) made d(share)/dG = 1/row-sum explode (1e18-1e31, then inf and NaN in AdamW)."""
    torch.manual_seed(0)
    logits = torch.randn(6, 4)
    logits[2] = -60.0  # row sum ~ e^-60
    logits.requires_grad_(True)
    x = torch.randn(2, 1 + 6, 8)
    state = TokenState.start(x, 1)
    state.size = torch.ones(2, 7, 1)
    merged = soft_merge(x, state, logits.softmax(dim=0)[None].expand(2, 6, 4))
    (merged.sum() + state.attn_bias(torch.float32).logsumexp(-1).sum()).backward()
    assert not state.size.requires_grad
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().max() < 1e3
    torch.testing.assert_close(state.size[:, 1:].sum(dim=1), torch.full((2, 1), 6.0))  # sizes still add up


def test_untrained_later_block_does_not_mix():
    model = _ltm(ib_step="always")  # statistics filled: the IB step is live at inference too
    block = _reducers(model)[4]
    assert isinstance(block, ReMerge)
    captured = {}
    block.register_forward_pre_hook(lambda mod, args: captured.__setitem__("x", args[0]))
    with torch.no_grad():
        model(torch.randn(3, 3, 32, 32))
        x = captured["x"]
        g = block.mixing(x[:, 1:])
        out = block(x, TokenState(prefix=1), AttnInfo())
    diagonal = g.diagonal(dim1=-2, dim2=-1)
    assert diagonal.min() > 0.985 and diagonal.mean() > 0.989  # 99% by the initial s_l
    assert (out - x).abs().max() < 0.05 * x.abs().max()
    fresh = _reducers(_ltm(stats=False))[4]  # before any statistics G~ = I exactly: G_qq = 0.99
    with torch.no_grad():  # one matrix for every image
        torch.testing.assert_close(fresh.mixing(x[:, 1:]).diagonal(dim1=-2, dim2=-1), torch.full((1, P), 0.99))


def _entering(model, images):
    """The tokens entering each later block's merge, from one eval forward."""
    captured = {}
    hooks = [b.reducer.register_forward_pre_hook(lambda mod, args: captured.__setitem__(mod, args[0]))
             for b in model.blocks[1:]]
    with torch.no_grad():
        model(images)
    for h in hooks:
        h.remove()
    return captured


def test_by_default_inference_merges_by_the_learned_masks_alone():
    """``ib_step=train``: at inference ``G~ = I``, so every later block's ``G_l`` is the column
    softmax of ``s_l I`` over the entries ``M_l`` keeps, the same for every image, and its MLP
    never runs; ``ib_step=always`` takes the IB step per image."""
    model = _ltm()
    with torch.no_grad():  # a trained-looking mask: drop some entries (in place, as a step would)
        for blk in model.blocks[1:]:
            blk.reducer.mask_logits[::3, 1::2] = -1.0
    images = torch.randn(3, 3, 32, 32)
    calls = []
    for blk in model.blocks[1:]:
        blk.reducer.mlp.register_forward_hook(lambda *a: calls.append(1))
    entering = _entering(model.eval(), images)
    assert not calls
    for block, x in entering.items():
        with torch.no_grad():
            g = block.mixing(x[:, 1:])
        keep = (block.mask_logits > 0) | torch.eye(P, dtype=torch.bool)
        e = torch.where(keep, torch.exp(block.scale * torch.eye(P)), torch.zeros(()))
        torch.testing.assert_close(g, (e / e.sum(dim=0, keepdim=True))[None].detach())
    always = _ltm(ib_step="always")
    always.load_state_dict(model.state_dict())
    steps = _entering(always.eval(), images)
    block = always.blocks[4].reducer
    with torch.no_grad():
        g = block.mixing(steps[block][:, 1:])
    assert g.shape == (3, P, P) and not torch.allclose(g[0], g[1])  # per image


def test_the_readings_train_alike_and_eta_0_is_the_mask_alone():
    """``ib_step`` changes inference only: the statistics pass and a training loss are the same
    under ``train`` and ``always``; ``eta = 0`` infers as ``ib_step=train``."""
    models = {step: _ltm(ib_step=step) for step in ("train", "always")}
    for (k, a), b in zip(models["train"].state_dict().items(), models["always"].state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)
    images, labels = torch.randn(4, 3, 32, 32), torch.arange(4)
    losses = []
    for model in models.values():
        torch.manual_seed(3)
        losses.append(_train_step(model.train(), images, labels))
    torch.testing.assert_close(losses[0], losses[1])
    zero = _ltm(eta=0.0, ib_step="always")
    zero.load_state_dict(models["train"].state_dict())
    with torch.no_grad():
        torch.testing.assert_close(zero.eval()(images), models["train"].eval()(images))


def test_inference_constants_are_computed_once_and_follow_a_change():
    """``G1`` and a later block's ``G_l`` are kept between eval forwards without gradient and
    recomputed when a parameter changes (an optimiser step, ``load_state_dict``)."""
    model = _ltm().eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(images)
    first, block = model.blocks[0].reducer, model.blocks[3].reducer
    kept = first._constants._values["g1"][2][0], block._constants._values["g"][2][0]
    with torch.no_grad():
        model(images)
    assert first._constants._values["g1"][2][0] is kept[0] and block._constants._values["g"][2][0] is kept[1]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["blocks.0.reducer.logits"] += torch.randn_like(state["blocks.0.reducer.logits"])
    state["blocks.3.reducer.scale"] -= 4.0
    model.load_state_dict(state)
    fresh = _ltm(stats=False).eval()
    reduction_context(fresh).reduction.prepare_load(fresh, state)
    fresh.load_state_dict(state)
    with torch.no_grad():
        after = model(images)
        torch.testing.assert_close(after, fresh(images))
    assert not torch.allclose(after, before)
    model.double()  # a move keeps the parameter objects: the kept float32 matrices are not reused
    with torch.no_grad():
        torch.testing.assert_close(model(images.double()), after.double(), rtol=1e-5, atol=1e-5)
    assert model.blocks[3].reducer._constants._values["g"][2][0].dtype == torch.float64


def test_ib_step_equals_the_literal_formula_and_the_input_term_cancels():
    torch.manual_seed(0)
    b, p, c, k, eta = 3, 5, 4, 6, 0.7
    xt, cent = torch.randn(b, p, c, dtype=torch.float64), torch.randn(k, p, c, dtype=torch.float64)
    log_q = torch.randn(k, k, dtype=torch.float64).log_softmax(dim=1)
    labels = torch.tensor([0, 3, 5])
    input_term = torch.randn(b, dtype=torch.float64)  # sum_b tau(X,b) log tau(X,b), per image
    expected = torch.empty(b, p, p, dtype=torch.float64)
    for i in range(b):
        s = torch.stack([torch.exp(-((xt[i] - cent[a]) ** 2).mean()) for a in range(k)])
        gamma, zeta = s.sum(), (s[:, None, None] * cent).sum(0)
        psi = input_term[i] - log_q[labels[i]]
        total = sum(xt[i] @ ((s[a] / gamma**2) * (gamma * cent[a] - zeta)).T * psi[a] for a in range(k))
        expected[i] = torch.eye(p, dtype=torch.float64) - 2 * eta * total
    torch.testing.assert_close(ib_mask_step(xt, cent, log_q[labels], eta), expected)


def test_training_uses_the_prior_expectation_like_inference_by_default():
    model = _ltm()
    block = _reducers(model)[3]
    reduction_context(model).labels = torch.tensor([2, 7])
    prior = (block.class_prior @ block.log_q)[None]
    block.train()  # the label must not leak into the trained forward: the same step as inference
    torch.testing.assert_close(block.log_q_rows(), prior)
    block.eval()
    torch.testing.assert_close(block.log_q_rows(), prior)


def test_step_labels_true_uses_the_label_in_training_and_the_prior_at_inference():
    model = _ltm(step_labels="true")
    block = _reducers(model)[3]
    labels = torch.tensor([2, 7])
    reduction_context(model).labels = labels
    block.train()
    torch.testing.assert_close(block.log_q_rows(), block.log_q[labels])
    block.eval()  # eval: the prior expectation, whatever the context holds
    torch.testing.assert_close(block.log_q_rows(), (block.class_prior @ block.log_q)[None])


def test_gradients_reach_the_first_mask_the_later_masks_scales_and_mlps():
    model = _ltm()
    model.train()
    torch.manual_seed(3)
    _train_step(model, torch.randn(8, 3, 32, 32), torch.arange(8)).backward()
    first, *later = _reducers(model)
    assert first.logits.grad.abs().sum() > 0
    for block in later:
        off_diagonal = block.mask_logits.grad.masked_select(~torch.eye(P, dtype=torch.bool))
        assert off_diagonal.abs().sum() > 0 and block.scale.grad.abs() > 0
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.mlp.parameters())


def test_frozen_backbone_stays_frozen_while_the_masks_train():
    model = _ltm()
    method = {n: p for n, p in model.named_parameters() if ".reducer." in n}
    backbone = {n: p for n, p in model.named_parameters() if n not in method}
    for p in backbone.values():
        p.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in model.state_dict().items() if n in backbone}
    start = {n: p.detach().clone() for n, p in method.items()}
    optimizer = torch.optim.AdamW(method.values(), lr=1e-2, weight_decay=0.0)
    model.train()
    data = _data(3, 8, seed=5)
    for images, labels in data():
        optimizer.zero_grad()
        _train_step(model, images, labels).backward()
        optimizer.step()
    assert all(torch.equal(model.state_dict()[n], v) for n, v in before.items())
    assert all(p.grad is None for p in backbone.values())
    changed = [n for n, p in method.items() if not torch.equal(p, start[n])]
    assert any("blocks.0.reducer.logits" in n for n in changed)
    assert any(n.endswith(".scale") for n in changed) and any(".mlp." in n for n in changed)


def test_inference_is_deterministic_training_is_not_and_gmacs_fall():
    model = _ltm()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
        model.train()
        assert not torch.equal(model(x), model(x))  # Gumbel noise in training only
    model.eval()
    images = torch.randn(1, 3, 32, 32)
    reduced, base = count_gmacs(model, images).mean, count_gmacs(tiny_vit(), images).mean
    assert reduced < 0.9 * base


def test_no_refresh_after_the_last_epoch_so_the_evaluated_model_is_the_trained_one():
    model = _ltm(epochs=2)
    before = {k: v.clone() for k, v in model.state_dict().items() if "centroids" in k or "log_q" in k}
    data = _data(2, 20, seed=7)
    _stage(model).epoch_end[0](model, 1, data)  # after the last of 2 epochs: nothing changes
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    _stage(model).epoch_end[0](model, 0, data)  # after the first: the refresh for epoch 2
    assert not all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_statistics_pass_fills_the_buffers_as_a_direct_computation():
    # first refresh done: the forward below uses non-trivial statistics; ``always``: the eval
    # forward below takes the IB step, as the statistics pass does under either reading
    model = _ltm(epochs=2, ib_step="always")
    first, *later = _reducers(model)
    data = _data(2, 20, seed=7)
    images = torch.cat([x for x, _ in data()])
    labels = torch.cat([y for _, y in data()])
    entering = {}
    hooks = [b.register_forward_pre_hook(lambda mod, args: entering.__setitem__(mod, args[0][:, 1:]))
             for b in later]
    with torch.no_grad():
        feats = final_features(model, images)
        xts = {b: b.mlp(entering[b]) for b in later}
    for h in hooks:
        h.remove()
    _stage(model).epoch_end[0](model, 0, data)  # the refresh under test

    onehot = F.one_hot(labels, 10).float()
    counts = onehot.sum(0)
    torch.testing.assert_close(later[0].class_prior, counts / counts.sum())
    for block in later:
        xt = xts[block]
        cent = (onehot.t() @ xt.flatten(1) / counts[:, None]).view(10, P, 48)
        tau = (-((xt[:, None] - cent[None]) ** 2).mean(dim=(2, 3))).softmax(dim=1)
        torch.testing.assert_close(block.centroids, cent, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(block.log_q, log_q_given_y(tau, labels, 10), atol=1e-4, rtol=1e-4)
    feat_cent = class_centroids(feats, labels, 10)
    torch.testing.assert_close(first.feature_centroids, feat_cent, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(first.feature_log_q, log_q_given_y(soft_assign(feats, feat_cent), labels, 10),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first.input_centroids, class_centroids(input_vectors(images), labels, 10))


def test_state_dict_round_trips_into_a_freshly_applied_model(tmp_path):
    model = _ltm(trace_source=True)
    with torch.no_grad():
        for p in [p for n, p in model.named_parameters() if ".reducer." in n]:
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "ltm.pt"
    torch.save(model.state_dict(), path)
    fresh = vitbench.apply(tiny_vit(), "ltm", trace_source=True)
    state = torch.load(path, weights_only=True)
    reduction_context(fresh).reduction.prepare_load(fresh, state)  # as vitbench.train.load_trained
    fresh.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))
    source, size = reduction_context(fresh).state.source, reduction_context(fresh).state.size
    torch.testing.assert_close(source.sum(dim=-1, keepdim=True), size)  # rows: the token sizes
    torch.testing.assert_close(source[:, 1:, 1:].sum(dim=1), torch.ones(2, 64))  # each patch once


@pytest.mark.parametrize("bad, message", [
    ({"ratio": 0.0}, r"ltm.ratio=0.0 is out of range; it must be in \(0, 1\]"),
    ({"ratio": 1.5}, r"ltm.ratio=1.5 is out of range"),
    ({"tau": 0.0}, r"ltm.tau=0.0 is out of range; it must be > 0"),
    ({"eta": -1.0}, r"ltm.eta=-1.0 is out of range"),
    ({"ib_weight": -0.1}, r"ltm.ib_weight=-0.1 is out of range"),
    ({"stats_images": -1}, r"ltm.stats_images=-1 is out of range"),
    ({"optimizer": "Lion"}, r"ltm.optimizer='Lion'; valid values: SGD, AdamW, Adam"),
    ({"init": "random"}, r"ltm.init='random'; valid values: auto, runs, grid"),
    ({"step_labels": "oracle"}, r"ltm.step_labels='oracle'; valid values: prior, true"),
    ({"mlp_lr": -0.1}, r"ltm.mlp_lr=-0.1 is out of range; it must be >= 0 \(None: the recipe's"),
])
def test_bad_parameters(bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "ltm", **bad)


def test_ibtm_is_an_alias_and_the_stage_declares_the_defaults():
    spec = get_host().method("ibtm")
    assert spec.name == "ltm" and spec.needs_training
    stage = _stage(_ltm(stats=False, lr=0.01, epochs=2))
    assert (stage.epochs, stage.lr, stage.optimizer, stage.batch_size) == (2, 0.01, "AdamW", 64)
    assert stage.extra_loss is not None and stage.before and stage.epoch_end
    assert _stage(_ltm(stats=False, ib_weight=0.0)).extra_loss is None


def _trained_names(model, train_backbone=False):
    from vitbench.train.stages import trainable_parameters

    return set(trainable_parameters(model, _stage(model), train_backbone))


def test_the_ib_step_mlps_stay_frozen_by_default_and_train_at_mlp_lr_when_asked():
    """Default: M1, the M_l logits and the scales train; the MLPs of the IB step do not (their
    features must stay those the statistics were taken with, plugins/ltm/ "Training")."""
    model = _ltm(stats=False)
    names = _trained_names(model)
    assert "blocks.0.reducer.logits" in names
    assert {"blocks.1.reducer.mask_logits", "blocks.1.reducer.scale"} <= names
    assert not any(".reducer.mlp." in n for n in names)
    assert not any(".reducer." not in n for n in names)  # the backbone stays frozen

    model = _ltm(stats=False, mlp_lr=0.05)
    assert any(".reducer.mlp." in n for n in _trained_names(model))
    assert _stage(model).lr_groups == ((".reducer.mlp.", 0.05),)


def test_the_mlp_learning_rate_does_not_reach_the_backbone_mlps():
    """With --train-backbone, the backbone's own ``blocks.i.mlp`` must train at ``lr``, not at
    the IB step MLPs' ``mlp_lr``."""
    from vitbench.train.stages import _optimizer

    model = _ltm(stats=False, lr=0.2, mlp_lr=0.01)
    params = {n: p for n, p in model.named_parameters()
              if n in _trained_names(model, train_backbone=True)}
    lr_of = {id(p): g["lr"] for g in _optimizer(_stage(model), params).param_groups for p in g["params"]}
    assert lr_of[id(params["blocks.1.block.mlp.fc1.weight"])] == 0.2
    assert lr_of[id(params["blocks.1.reducer.mlp.1.weight"])] == 0.01


def test_a_family_whose_adapter_offers_no_merge_grid_is_refused_clearly(monkeypatch):
    import dataclasses

    import timm
    from vitbench_plugins.ltm import LTMParams
    from vitbench_plugins.ltm.reduction import build

    from vitbench.errors import UnsupportedError

    host = get_host()
    info = host.family("efficientvit").describe(timm.create_model("efficientvit_b0", pretrained=False))
    family = host.family
    monkeypatch.setattr(host, "family", lambda name: dataclasses.replace(family(name), merge_grid=None)
                        if name == "efficientvit" else family(name))  # as a third-party adapter without one
    with pytest.raises(UnsupportedError, match=r"^ltm has no merge grid for the 'efficientvit' family; "
                                               r"known: mobilevit, swin, vit$"):
        build(LTMParams(), info)
