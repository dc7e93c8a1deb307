"""LTMP (docs/methods.md §2): learned merge/prune thresholds, masked in training, removed at inference."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import enable_source_tracing, last_state, reduction_context, unmerge
from vitbench.errors import ParamError
from vitbench.measure import count_gmacs
from vitbench.host import get_host
from vitbench.testing import check_method, tiny_vit
from vitbench.testing import tiny_deit_distilled
from vitbench_plugins.ltmp import LTMPParams
from vitbench_plugins.ltmp.reduction import LTMPReducer, clamp_thresholds, cost_model, flops_ratio, kept_tokens


def _reducers(model):
    return [m for m in model.modules() if isinstance(m, LTMPReducer)]


def _set(model, theta_m=None, theta_p=None):
    with torch.no_grad():
        for r in _reducers(model):
            if theta_m is not None:
                r.theta_m.fill_(theta_m)
            if theta_p is not None:
                r.theta_p.fill_(theta_p)
    return model


def _sharp_vit():
    """tiny_vit with sharper attention (qkv x6): a random tiny_vit attends almost uniformly
    (every importance within 1% of 1/65), so pruning needs a less uniform one."""
    model = tiny_vit()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(6.0)
    return model


def _images(n=4, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _stage(model):
    return reduction_context(model).reduction.train[0]


def test_registers_through_the_entry_point():
    spec = get_host().method("ltmp")
    assert spec.name == "ltmp" and spec.needs_training and get_host().families_for(spec) == ["mobilevit", "swin", "vit"]
    model = vitbench.apply(tiny_vit(), "ltmp")
    assert len(_reducers(model)) == 12
    stage = _stage(model)
    assert stage.optimizer == "SGD" and stage.momentum == 0.0 and stage.schedule == "cosine"
    assert stage.lr_groups == (("theta_m", 5e-3), ("theta_p", 5e-6))
    assert stage.label_smoothing == 0.1 and stage.epochs == 1
    assert clamp_thresholds in stage.after_step and stage.extra_loss is not None
    # only the thresholds are the method's parameters; the weights' state dict keys stay timm's
    names = {k for k, _ in model.named_parameters() if "reducer" in k}
    assert names == {f"blocks.{i}.reducer.theta_{t}" for i in range(12) for t in "mp"}
    assert set(tiny_vit().state_dict()) <= set(model.state_dict())


def test_conforms():
    # the default thresholds (0.9, 0.0) barely reduce a random model; conformance checks the rest
    assert check_method("ltmp", reduces_tokens=False).output_shape == (2, 10)


def test_without_prefix_tokens_each_image_keeps_its_most_important_token():
    model = vitbench.apply(tiny_vit(class_token=False, global_pool="avg"), "ltmp")
    _set(model, theta_m=1.5, theta_p=0.5)  # every importance is below 0.5
    x = _images(3)
    with torch.inference_mode():
        batched = model(x)
        assert kept_tokens(model).tolist() == [1, 1, 1]
        alone = torch.cat([model(x[i : i + 1]) for i in range(3)])
    assert torch.allclose(batched, alone, atol=1e-5, rtol=0)


def test_layers_choose_the_reducing_blocks():
    model = vitbench.apply(tiny_vit(), "ltmp", layers=(2, 5))
    assert [blk.index for blk in model.blocks if blk.reducer is not None] == [2, 5]
    assert [i for i, blk in enumerate(model.blocks) if not blk.fused] == [2, 5]


@pytest.mark.parametrize("train", [False, True])
def test_thresholds_that_keep_everything_equal_the_unpatched_model(train):
    base = tiny_vit()
    model = _set(vitbench.apply(tiny_vit(), "ltmp"), theta_m=1.5, theta_p=-1.0)
    x = _images()
    model.train(train)
    with torch.no_grad():
        expected, out = base(x), model(x)
    assert torch.allclose(out, expected, atol=1e-5, rtol=0)
    assert reduction_context(model).token_counts == [65] * 12


def test_straight_through_gradients_reach_both_thresholds():
    model = vitbench.apply(tiny_vit(), "ltmp").train()
    for name, p in model.named_parameters():
        p.requires_grad_("reducer" in name)
    x, labels = _images(), torch.tensor([0, 1, 2, 3])
    logits = model(x)
    penalty = _stage(model).extra_loss(model, logits, labels)
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1) + penalty
    loss.backward()
    for r in _reducers(model):
        for theta in (r.theta_m, r.theta_p):
            assert theta.grad is not None and torch.isfinite(theta.grad) and theta.grad != 0
    extras = reduction_context(model).extras
    assert 0 < extras["ltmp_flops_ratio"] <= 1 and sorted(extras["ltmp_kept"]) == list(range(12))


def _one_step(max_grad):
    """The thresholds' raw gradients of one large-CE step and how far the stage's optimiser
    (with its gradient clamp) moves them, each divided by its learning rate."""
    from vitbench.train.stages import _optim_wrapper

    model = _set(vitbench.apply(_sharp_vit(), "ltmp", max_grad=max_grad), theta_m=0.3).train()
    params = {n: p for n, p in model.named_parameters() if "reducer" in n}
    for name, p in model.named_parameters():
        p.requires_grad_(name in params)
    stage = _stage(model)
    wrapper = _optim_wrapper(stage, params)
    before = {n: p.detach().clone() for n, p in params.items()}
    x, labels = _images(), torch.tensor([0, 1, 2, 3])
    logits = model(x)
    loss = 1e3 * F.cross_entropy(logits, labels, label_smoothing=0.1) + stage.extra_loss(model, logits, labels)
    loss.backward()
    grads = torch.stack([p.grad.clone() for p in params.values()])
    wrapper.step()
    lr = {n: next(v for k, v in stage.lr_groups if k in n) for n in params}
    moved = torch.stack([(before[n] - p.detach()) / lr[n] for n, p in params.items()])
    return grads, moved


def test_each_threshold_step_is_bounded_by_max_grad():
    # docs/methods.md §2 "Thresholds": a threshold's straight-through CE gradient can be huge
    # (one step would throw it onto a clamp bound, where the masker's gradient vanishes); the
    # stage clamps each gradient to [-max_grad, max_grad] before the step (after DDP's average)
    grads, moved = _one_step(0.5)
    assert float(grads.abs().max()) > 0.5  # the bound binds somewhere
    assert torch.allclose(moved, grads.clamp(-0.5, 0.5), rtol=1e-3, atol=1e-6)
    free_grads, free_moved = _one_step(None)
    assert torch.equal(free_grads, grads)  # the forward and backward are the same; only the step differs
    assert torch.allclose(free_moved, free_grads, rtol=1e-3, atol=1e-6)
    assert LTMPParams().max_grad == 10.0


def test_training_masks_tokens_instead_of_removing_them():
    model = _set(vitbench.apply(tiny_vit(), "ltmp"), theta_m=0.6).train()
    x = _images()
    with torch.no_grad():
        model(x)
    state = reduction_context(model).state
    assert reduction_context(model).token_counts == [65] * 12  # every token keeps flowing
    mask = state.private["ltmp_mask"]
    assert set(mask.unique().tolist()) == {0.0, 1.0}  # hard forward
    assert torch.equal(state.key_bias[:, 0, 0], torch.log(mask + 1e-6))
    assert state.size.max() > 1  # merge destinations grew
    # the same thresholds at inference remove exactly the tokens training masked
    model.eval()
    with torch.no_grad():
        model(x)
    assert torch.equal(kept_tokens(model), mask.sum(dim=1).long())


def test_frozen_backbone_stays_bitwise_equal_over_sgd_steps():
    model = vitbench.apply(tiny_vit(), "ltmp").train()
    before = {k: v.clone() for k, v in model.state_dict().items() if "reducer" not in k}
    thresholds = [p for n, p in model.named_parameters() if "reducer" in n]
    for n, p in model.named_parameters():
        p.requires_grad_("reducer" in n)
    opt = torch.optim.SGD(thresholds, lr=0.5)
    stage = _stage(model)
    for step in range(3):
        x = _images(4, seed=step)
        labels = torch.randint(0, 10, (4,), generator=torch.Generator().manual_seed(step))
        logits = model(x)
        loss = F.cross_entropy(logits, labels, label_smoothing=0.1) + stage.extra_loss(model, logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for callback in stage.after_step:
            callback(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    moved = [r.theta_m.item() for r in _reducers(model)]
    assert any(m != pytest.approx(0.9) for m in moved)
    assert all(0.0 <= t.item() <= 1.0 for t in thresholds)


def test_inference_is_hard_deterministic_and_varies_per_image():
    model = _set(vitbench.apply(tiny_vit(), "ltmp"), theta_m=0.6)
    x = _images(6)
    with torch.inference_mode():
        first = model(x)
        counts = kept_tokens(model).clone()
        second = model(x)
    assert torch.equal(first, second)
    assert len(set(counts.tolist())) > 1  # token counts differ per image
    assert reduction_context(model).token_counts[-1] == int(counts.max())  # padded to the max
    size = last_state(model).size
    assert size[:, 1:].sum(dim=1).squeeze(-1).tolist() == [64.0] * 6  # merging only: all patches covered


@pytest.mark.parametrize("theta_m, theta_p", [(0.6, 0.0), (0.8, 0.015), (1.5, 0.015)])
def test_padded_batch_equals_each_image_alone(theta_m, theta_p):
    model = _set(vitbench.apply(_sharp_vit(), "ltmp"), theta_m=theta_m, theta_p=theta_p)
    x = _images(4)
    with torch.inference_mode():
        batched = model(x)
        counts = kept_tokens(model).clone()
        alone, alone_counts = [], []
        for i in range(4):
            alone.append(model(x[i : i + 1]))
            alone_counts.append(int(kept_tokens(model)))
    assert len(set(counts.tolist())) > 1, "the case should pad"
    assert counts.tolist() == alone_counts
    for i in range(4):
        assert torch.allclose(batched[i], alone[i][0], atol=1e-5, rtol=0)


def test_a_trained_looking_setting_costs_fewer_gmacs():
    base = tiny_vit()
    model = _set(vitbench.apply(tiny_vit(), "ltmp"), theta_m=0.7)
    x = _images(3)
    full, reduced = count_gmacs(base, x), count_gmacs(model, x)
    assert reduced.mean < 0.8 * full.mean
    assert reduced.std > 0 and full.std == 0  # input-dependent cost


def test_source_tracing_covers_every_patch_once_when_only_merging():
    model = enable_source_tracing(_set(vitbench.apply(tiny_vit(), "ltmp"), theta_m=0.6))
    x = _images(3)
    with torch.inference_mode():
        tokens = model.forward_features(x)
    state = last_state(model)
    assert torch.equal(state.source.sum(dim=1), torch.ones(3, 65))
    assert unmerge(tokens, state).shape == (3, 65, 48)


def test_clamp_callback():
    model = vitbench.apply(tiny_vit(), "ltmp")
    _set(model, theta_m=1.7, theta_p=-0.3)
    _reducers(model)[4].theta_m.data.fill_(0.4)
    clamp_thresholds(model)
    assert [r.theta_m.item() for r in _reducers(model)] == [1.0] * 4 + [pytest.approx(0.4)] + [1.0] * 7
    assert all(r.theta_p.item() == 0.0 for r in _reducers(model))


def test_flops_ratio_by_hand():
    # n=10, C=4: full = 6*10*16 + 100*4 = 1360; block 0 (m_prev=1, m=.5): 320 + 400 + 320 = 1040;
    # block 1 (m_prev=.5, m=.25): 160 + 100 + 160 = 420; block 2 reduces nothing (m stays .25):
    # 80 + 25 + 160 = 265. Mean: (1040 + 420 + 265) / 3 / 1360.
    assert flops_ratio([0.5, 0.25, None], num_tokens=10, dim=4) == pytest.approx(1725 / 3 / 1360)
    assert flops_ratio([1.0] * 12, num_tokens=65, dim=48) == pytest.approx(1.0)
    per_image = flops_ratio([torch.tensor([1.0, 0.5]), torch.tensor([1.0, 0.25])], 10, 4)
    assert per_image.tolist() == pytest.approx([1.0, (1040 + 420) / 2 / 1360])


def test_penalty_is_zero_at_target_and_absent_at_inference():
    model = _set(vitbench.apply(tiny_vit(), "ltmp", target=1.0), theta_m=1.5, theta_p=-1.0).train()
    x, labels = _images(2), torch.tensor([0, 1])
    logits = model(x)
    penalty = _stage(model).extra_loss(model, logits, labels)
    assert penalty.item() == pytest.approx(0.0, abs=1e-10)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    assert _stage(model).extra_loss(model, logits, labels) is None



def _per_image_gmacs(model, x):
    return torch.tensor([count_gmacs(model, x[i : i + 1]).mean for i in range(x.shape[0])], dtype=torch.float64)


@pytest.mark.parametrize("factory, layers", [(_sharp_vit, None), (_sharp_vit, (2, 5, 9)), (tiny_deit_distilled, None)])
def test_cost_model_is_the_counted_gmacs(factory, layers):
    # matched compute (docs/methods.md §2): the cost model LTMP's penalty measures in matched mode
    # is the count of vitbench.measure, per image, term for term (fixed costs, per-block
    # attention before the reduction, LTMP's matching, MLP after it)
    base = factory()
    info = get_host().family_of(base).describe(base)
    model = _set(vitbench.apply(factory(), "ltmp", layers=layers), theta_m=0.2, theta_p=0.0155)
    reducing = [layers is None or i in layers for i in range(12)]
    cost = cost_model(model, info, reducing)
    assert cost.full == pytest.approx(count_gmacs(base, _images(1)).mean * 1e9, rel=1e-12)
    assert cost_model(base, info, reducing).full == cost.full  # reduced or not, the same model
    x = _images(4)
    counted = _per_image_gmacs(model, x)
    assert float(counted.max()) < 0.9 * cost.full / 1e9  # thresholds that merge and prune
    for i in range(4):
        with torch.inference_mode():
            model(x[i : i + 1])
        counts = reduction_context(model).state.private["ltmp_counts"]
        kept = [float(counts[b][0]) / info.num_tokens if reducing[b] else None for b in range(12)]
        assert cost.macs(kept) / 1e9 == pytest.approx(float(counted[i]), rel=1e-12)


def test_matched_penalty_trains_towards_the_counted_gmacs_fraction():
    # gmacs_fraction = F: the penalty's ratio of each image is that image's counted GMACs over the
    # baseline's (training masks the very tokens inference removes); target is not used
    base = _sharp_vit()
    model = _set(vitbench.apply(_sharp_vit(), "ltmp", gmacs_fraction=0.6, target=0.1),
                 theta_m=0.2, theta_p=0.0155)
    x, labels = _images(4), torch.tensor([0, 1, 2, 3])
    expected = _per_image_gmacs(model, x) / count_gmacs(base, x[:1]).mean
    model.train()
    logits = model(x)
    penalty = _stage(model).extra_loss(model, logits, labels)
    ratio = reduction_context(model).extras["ltmp_flops_ratio"]
    assert float(ratio) == pytest.approx(float(expected.mean()), rel=1e-6)
    assert penalty.item() == pytest.approx(10.0 * (float(expected.mean()) - 0.6) ** 2, rel=1e-5)
    assert penalty.requires_grad
    # the default (gmacs_fraction=None) keeps the paper's ratio against target
    paper = _set(vitbench.apply(_sharp_vit(), "ltmp", target=0.1), theta_m=0.2, theta_p=0.0155).train()
    logits = paper(x)
    penalty = _stage(paper).extra_loss(paper, logits, labels)
    kept = reduction_context(paper).state.private["ltmp_kept"]
    own = flops_ratio([kept[i] for i in range(12)], 65, 48).mean()
    assert penalty.item() == pytest.approx(10.0 * (float(own) - 0.1) ** 2, rel=1e-6)
    assert abs(float(own) - float(ratio)) > 0.01  # the two measures differ on the same tokens


@pytest.mark.slow
def test_default_fine_tuning_of_the_default_model_lands_near_its_target():
    # the embedded default model, default LTMP (target 0.75): the first steps' CE gradients of
    # some thresholds exceed 10^2; unbounded (max_grad=None) they threw block 0's theta_m to 0,
    # where every similarity sits > 6 tau above it and the masker's gradient vanishes, and the
    # run ended at 0.34 x the baseline's GMACs. Bounded, 40 steps land near 0.75 x (0.748 measured).
    from vitbench.tasks.cls import default_model as dm
    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.finetune import finetune
    from vitbench.train.batches import cls_batches, data_preprocessor, first_images

    base = dm.build_arch()
    base.load_state_dict(torch.load(dm.shipped_paths(dm.train_config())[0], weights_only=True))
    base.eval()
    data = resolve_cls_data(None, base)
    images = first_images(cls_batches(data.dataset_cfg(limit=16), data_preprocessor(base, data.bgr)), 16)
    model = vitbench.apply(copy.deepcopy(base), "ltmp")
    finetune(model, data, limit=2560, seed=0)
    ratio = count_gmacs(model.eval(), images).mean / count_gmacs(base, images).mean
    assert abs(ratio - 0.75) < 0.08, ratio


def test_matched_compute_sets_gmacs_fraction():
    knob = get_host().method("ltmp").budget
    assert (knob.param, knob.mode, knob.larger_means) == ("gmacs_fraction", "fraction", "more")


@pytest.mark.parametrize("bad, message", [
    (dict(target=0.0), r"ltmp.target=0.0 is out of range; it must be in \(0, 1\] \(the FLOPs ratio\)"),
    (dict(target=1.5), r"ltmp.target=1.5 is out of range"),
    (dict(gmacs_fraction=0.0), r"ltmp.gmacs_fraction=0.0 is out of range; it must be in \(0, 1\] \(the fraction of the model's GMACs"),
    (dict(gmacs_fraction=1.5), r"ltmp.gmacs_fraction=1.5 is out of range"),
    (dict(tau=0.0), r"ltmp.tau=0.0 is out of range; it must be > 0 \(the temperature\)"),
    (dict(tau=-1.0), r"ltmp.tau=-1.0 is out of range"),
    (dict(lambda_flops=-1.0), r"ltmp.lambda_flops=-1.0 is out of range"),
    (dict(epochs=0), r"ltmp.epochs=0 is out of range"),
    (dict(lr_merge=-1e-3), r"ltmp.lr_merge=-0.001 is out of range"),
    (dict(max_grad=0.0), r"ltmp.max_grad=0.0 is out of range; it must be > 0 \(or None: unbounded\)"),
    (dict(optimizer="LBFGS"), r"valid values: SGD, AdamW, Adam"),
    (dict(label_smoothing=1.0), r"ltmp.label_smoothing=1.0 is out of range"),
    (dict(batch_size=0), r"ltmp.batch_size=0 is out of range"),
    (dict(layers=(3, 12)), r"ltmp.layers contains 12; valid block indices for this model: 0..11"),
])
def test_bad_parameters(bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "ltmp", **bad)


def test_reduced_model_state_dict_round_trips():
    model = _set(vitbench.apply(tiny_vit(), "ltmp"), theta_m=0.55)
    fresh = vitbench.apply(tiny_vit(seed=1), "ltmp")
    fresh.load_state_dict(copy.deepcopy(model.state_dict()), strict=True)
    assert all(r.theta_m.item() == pytest.approx(0.55) for r in _reducers(fresh))
