"""DCS (docs/methods.md §7): channel masks, search, shrink, checkpoint loading, retraining with the IB
bound (§6). Training mechanics run as small hand-written loops on random data."""
from __future__ import annotations

import copy
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from vitbench_plugins.dcs import DCSParams

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError, UnsupportedError
from vitbench.measure.flops import count_gmacs
from vitbench.measure.ib import final_features, ib_terms, input_vectors, soft_assign
from vitbench.core.params import make_params
from vitbench.host import get_host
from vitbench.testing import check_method, tiny_vit

DEPTH = 4


def _images(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _data(batches: int = 2, n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
            for _ in range(batches)]


#: the mechanics tests use both kinds of selection and no budget (every ``alpha > 0`` channel is
#: kept), so the shrink's outcome is the search's own decision; the budget has its own tests
MECHANICS = {"arch": "both", "budget": 1.0}


def _apply(**params):  # type: ignore[no-untyped-def]
    base = tiny_vit(depth=DEPTH)
    return base, vitbench.apply(copy.deepcopy(base), "dcs", **{**MECHANICS, **params})


def _reducers(model):  # type: ignore[no-untyped-def]
    from vitbench_plugins.dcs.reduction import dcs_reducers

    return dcs_reducers(model)  # in block order, on any family


def _stage(model, name: str):  # type: ignore[no-untyped-def]
    return next(s for s in reduction_context(model).reduction.train if s.name == name)


def _randomise(model, seed: int = 0) -> None:
    """Input-dependent Q/K masks that drop some channels, and some negative alphas."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for reducer in _reducers(model):
            if reducer.qk_mask is not None:
                for lin in (m for m in reducer.qk_mask.modules() if isinstance(m, torch.nn.Linear)):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g))
                    lin.bias.copy_(torch.randn(lin.bias.shape, generator=g))
            if reducer.mlp_gate is not None:
                reducer.mlp_gate.alpha.copy_(torch.randn(reducer.mlp_gate.alpha.shape, generator=g))


def _shrink(model, size: int = 32) -> None:  # type: ignore[no-untyped-def]
    """The search's ``after`` callback, which counts the budget on the last forward's input."""
    with torch.inference_mode():
        model(torch.zeros(1, 3, size, size))
    _stage(model, "search").after[0](model)


def _mlp(model, i: int):  # type: ignore[no-untyped-def]
    return model.blocks[i].block.mlp


def _sgd_steps(model, stage, data, steps: int, lr: float = 0.5) -> None:  # type: ignore[no-untyped-def]
    """A hand-written stand-in for the fine-tuning loop: plain SGD on the stage's parameters,
    alpha on every third step (arch_keys), the other method parameters otherwise."""
    method = {n: p for n, p in model.named_parameters() if ".reducer." in n and p.requires_grad
              and (stage.trainable is None or any(k in n for k in stage.trainable))}
    arch = {n: p for n, p in method.items() if any(k in n for k in stage.arch_keys)}
    weights = {n: p for n, p in method.items() if n not in arch}
    model.train()
    for step in range(steps):
        group = arch if arch and step % 3 == 2 else weights
        images, labels = data[step % len(data)]
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        extra = stage.extra_loss(model, logits, labels) if stage.extra_loss is not None else None
        if extra is not None:
            loss = loss + extra
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in group.values():
                if p.grad is not None:
                    p -= lr * p.grad
    model.eval()


def test_resolves_through_the_plugin_host_and_conforms():
    spec = get_host().method("dcs")
    assert spec.name == "dcs" and spec.needs_training and spec.needs == {"channels"}
    assert get_host().families_for(spec) == ["efficientvit", "mobilevit", "swin", "vit"]
    check_method("dcs", model_factory=lambda: tiny_vit(depth=DEPTH), reduces_tokens=False)


@pytest.mark.parametrize("params", [{}, {"qk_mask": "separate"}, {"arch": "qk"}, {"arch": "out"}])
def test_untrained_equals_unpatched(params):
    base, model = _apply(**params)
    x = _images()
    with torch.inference_mode():
        assert (model(x) - base(x)).abs().max().item() < 1e-5
        assert torch.equal(model(x), model(x))


def test_straight_through_gradients_reach_theta_and_alpha():
    _, model = _apply(qk_mask="separate")
    model.train()
    images, labels = _data(1)[0]
    logits = model(images)
    loss = F.cross_entropy(logits, labels) + _stage(model, "search").extra_loss(model, logits, labels)
    loss.backward()
    for reducer in _reducers(model):
        for lin in (reducer.qk_mask.theta_q, reducer.qk_mask.theta_k):
            assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
            assert lin.bias.grad.abs().sum() > 0
        assert reducer.mlp_gate.alpha.grad is not None and reducer.mlp_gate.alpha.grad.abs().sum() > 0


def test_masks_are_hard_in_training_and_hard_deterministic_at_inference():
    _, model = _apply()
    _randomise(model)
    reducer = model.blocks[1].reducer
    x = torch.randn(2, 65, 48)
    reducer.train()
    mq, mk = reducer.qk_mask.masks(x, reducer.tau)
    assert mq is mk and set(mq.unique().tolist()) <= {0.0, 1.0}
    assert not torch.equal(mq, reducer.qk_mask.masks(x, reducer.tau)[0])  # Gumbel noise
    assert set(reducer.mlp_gate(reducer.tau).unique().tolist()) <= {0.0, 1.0}
    reducer.eval()
    with torch.no_grad():
        m, _ = reducer.qk_mask.masks(x, reducer.tau)
        theta = reducer.qk_mask.theta(x).view(2, 65, 3, 16).transpose(1, 2)
    assert torch.equal(m, (theta > 0).float()) and torch.equal(m, reducer.qk_mask.masks(x, reducer.tau)[0])
    assert 0 < m.mean() < 1
    alpha = reducer.mlp_gate.alpha
    assert torch.equal(reducer.mlp_gate(reducer.tau).detach(), (alpha > 0).float())
    images = _images()
    with torch.inference_mode():
        assert torch.equal(model(images), model(images))
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(images), model(images))


def test_shrink_keeps_the_selected_channels_and_the_masked_outputs():
    base, model = _apply()
    _randomise(model)
    x = _images()
    alphas = [r.mlp_gate.alpha.detach().clone() for r in _reducers(model)]
    with torch.inference_mode():
        masked = model(x)
    _shrink(model)
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5
    for i, (reducer, alpha) in enumerate(zip(_reducers(model), alphas)):
        kept = (alpha > 0).nonzero().flatten()
        mlp, full = _mlp(model, i), base.blocks[i].mlp
        assert 0 < len(kept) < 48 and torch.equal(reducer.kept, kept)
        assert mlp.fc1.weight.shape == (96, len(kept)) and mlp.fc2.weight.shape == (len(kept), 96)
        assert torch.equal(mlp.fc1.weight, full.fc1.weight[:, kept])
        assert torch.equal(mlp.fc2.bias, full.fc2.bias[kept])
        assert reducer.mlp_gate is None
    keys = set(model.state_dict())
    assert set(base.state_dict()) <= keys  # the timm keys, only smaller
    assert not any("alpha" in k for k in keys) and "blocks.0.reducer.kept" in keys


def test_a_block_may_lose_every_mlp_channel():
    _, model = _apply(arch="out")
    with torch.no_grad():
        model.blocks[0].reducer.mlp_gate.alpha.fill_(-1.0)
    x = _images()
    with torch.inference_mode():
        masked = model(x)
    _shrink(model)
    assert _mlp(model, 0).fc1.weight.shape == (96, 0) and _mlp(model, 0).fc2.weight.shape == (0, 96)
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5


def test_gmacs_fall_after_the_shrink():
    x = _images(1)
    base, model = _apply()
    _randomise(model)
    masked = count_gmacs(model, x).mean
    _shrink(model)
    assert count_gmacs(model, x).mean < masked
    base, out_only = _apply(arch="out")
    _randomise(out_only)
    kept = sum(int((r.mlp_gate.alpha > 0).sum()) for r in _reducers(out_only))
    with torch.inference_mode():
        out_only(x)  # the shrink counts the budget on the last forward's input
    shrink = _stage(out_only, "search").after[0]
    shrink(out_only)
    saved = count_gmacs(base, x).mean - count_gmacs(out_only, x).mean
    # fc1 and fc2 lose 65 tokens x 96 hidden MACs for every dropped channel
    assert math.isclose(saved, 65 * 2 * 96 * (DEPTH * 48 - kept) / 1e9, rel_tol=1e-6)


def test_prepare_load_round_trip():
    _, trained = _apply()
    _randomise(trained)
    _shrink(trained)
    data = _data()
    _stage(trained, "retrain").before[0](trained, lambda: iter(data))
    state = trained.state_dict()
    assert state["blocks.3.reducer.ib.log_q"].shape == (10, 10)
    _, fresh = _apply()
    with pytest.raises(RuntimeError, match="size mismatch"):
        fresh.load_state_dict(state, strict=True)
    _, fresh = _apply()
    reduction_context(fresh).reduction.prepare_load(fresh, state)
    fresh.load_state_dict(state, strict=True)
    x = _images()
    with torch.inference_mode():
        assert torch.equal(fresh(x), trained(x))
    assert torch.equal(fresh.blocks[3].reducer.ib.feature_centroids, trained.blocks[3].reducer.ib.feature_centroids)
    _, wrapped = _apply()  # keys under a wrapper's prefix are found too
    reduction_context(wrapped).reduction.prepare_load(wrapped, {f"backbone.{k}": v for k, v in state.items()})
    wrapped.load_state_dict(state, strict=True)


def test_tau_schedule_is_an_epoch_end_callback_and_a_buffer():
    _, model = _apply(tau0=3.0, tau_decay=0.5)
    decay = _stage(model, "search").epoch_end
    assert len(decay) == 1
    decay[0](model, 0, lambda: iter(()))
    decay[0](model, 1, lambda: iter(()))
    assert all(r.tau.item() == 0.75 for r in _reducers(model))
    assert model.state_dict()["blocks.2.reducer.tau"].item() == 0.75


def test_the_loss_sees_the_counted_cost_of_the_hard_decision():
    """The search's penalty is ``lam * log(cost / target)`` with ``cost`` the counted GMACs of
    the model the shrink would keep now (``alpha > 0``; Q/K mask Linears included) -- not a
    relaxation -- and its straight-through gradient pushes every ``alpha`` down."""
    base, model = _apply(lam=0.5, budget=0.8)
    with torch.no_grad():
        model.blocks[0].reducer.mlp_gate.alpha[:30] = -0.5
        model.blocks[2].reducer.mlp_gate.alpha[5:9] = -3.0
    model.train()
    images, labels = _data(1)[0]
    logits = model(images)
    penalty = _stage(model, "search").extra_loss(model, logits, labels)
    shrunk = copy.deepcopy(model).eval()
    for blk in shrunk.blocks:
        blk.reducer.shrink_block(blk.block)
    x = images[:1]
    counted, baseline = count_gmacs(shrunk, x).mean, count_gmacs(base, x).mean
    assert math.isclose(penalty.item(), 0.5 * math.log(counted / (0.8 * baseline)), rel_tol=1e-6)
    penalty.backward()
    assert all((r.mlp_gate.alpha.grad > 0).all() for r in _reducers(model))  # it pushes alpha down
    # under the budget the penalty is zero: the cross-entropy alone ranks the channels there
    _, loose = _apply(arch="out", budget=1.0)
    loose.train()
    logits = loose(images)
    assert _stage(loose, "search").extra_loss(loose, logits, labels).item() == 0.0


def test_options_decide_which_modules_and_stages_exist():
    def names(**params):  # type: ignore[no-untyped-def]
        return {n.split("reducer.", 1)[1] for n, _ in _apply(**params)[1].named_parameters() if "reducer." in n}

    assert names() == {"qk_mask.theta.weight", "qk_mask.theta.bias", "mlp_gate.alpha"}
    assert names(qk_mask="separate") == {"qk_mask.theta_q.weight", "qk_mask.theta_q.bias",
                                         "qk_mask.theta_k.weight", "qk_mask.theta_k.bias", "mlp_gate.alpha"}
    assert names(arch="qk") == {"qk_mask.theta.weight", "qk_mask.theta.bias"}
    assert names(arch="out") == {"mlp_gate.alpha"}

    _, model = _apply(arch_lr=0.3, batch_size=16)
    search, retrain = reduction_context(model).reduction.train
    assert (search.name, search.arch_keys, search.arch_fraction) == ("search", ("alpha",), 0.3)
    assert search.lr_groups == (("alpha", 0.3),) and search.batch_size == 16
    assert retrain.name == "retrain" and retrain.trainable == ("qk_mask",)
    assert not any("alpha" in n and any(k in n for k in retrain.trainable) for n, _ in model.named_parameters())
    _, qk_only = _apply(arch="qk", retrain_epochs=0)
    (search,) = reduction_context(qk_only).reduction.train
    assert search.arch_keys == () and search.extra_loss is None
    assert all(r.ib is None for r in _reducers(qk_only))
    _, out_only = _apply(arch="out")  # only alpha, fixed after the search: nothing to retrain
    assert [s.name for s in reduction_context(out_only).reduction.train] == ["search"]
    _, no_ib = _apply(eta=0.0)
    assert _stage(no_ib, "retrain").extra_loss is None and all(r.ib is None for r in _reducers(no_ib))


def test_frozen_backbone_stays_frozen_through_search_shrink_and_retraining():
    base, model = _apply()
    for name, p in model.named_parameters():
        p.requires_grad_(".reducer." in name)
    frozen = {k: v.clone() for k, v in model.state_dict().items() if ".reducer." not in k}
    theta0 = model.blocks[0].reducer.qk_mask.theta.weight.detach().clone()
    alpha0 = model.blocks[0].reducer.mlp_gate.alpha.detach().clone()
    data = _data()
    search, retrain = reduction_context(model).reduction.train
    _sgd_steps(model, search, data, steps=3)
    assert not torch.equal(model.blocks[0].reducer.qk_mask.theta.weight, theta0)
    assert not torch.equal(model.blocks[0].reducer.mlp_gate.alpha, alpha0)
    for callback in search.epoch_end:
        callback(model, 0, lambda: iter(data))
    with torch.no_grad():  # make the shrink drop something
        model.blocks[1].reducer.mlp_gate.alpha[:5] = -1.0
    for callback in search.after:
        callback(model)
    kept = model.blocks[1].reducer.kept  # the budget (mask Linears included) may drop more
    assert _mlp(model, 1).fc1.in_features == len(kept) <= 43 and int(kept.min()) >= 5
    for callback in retrain.before:
        callback(model, lambda: iter(data))
    theta1 = model.blocks[0].reducer.qk_mask.theta.weight.detach().clone()
    _sgd_steps(model, retrain, data, steps=2)
    assert not torch.equal(model.blocks[0].reducer.qk_mask.theta.weight, theta1)
    for callback in retrain.epoch_end:
        callback(model, 0, lambda: iter(data))
    for callback in retrain.after:
        callback(model)
    assert all(not p.requires_grad and p.grad is None
               for n, p in model.named_parameters() if ".reducer." not in n)
    state = model.state_dict()
    for key, value in frozen.items():  # the backbone only lost the dropped channels' weights
        block = key.split(".")[1] if key.startswith("blocks.") else None
        kept = model.blocks[int(block)].reducer.kept if block is not None else None
        if key.endswith("mlp.fc1.weight"):
            assert torch.equal(state[key], value[:, kept])
        elif key.endswith(("mlp.fc2.weight", "mlp.fc2.bias")):
            assert torch.equal(state[key], value[kept])
        else:
            assert torch.equal(state[key], value), key
    assert not model.blocks[-1]._forward_hooks  # the retraining's capture hook is gone


def test_ib_bound_waits_t_warm_epochs_and_matches_section_6():
    _, model = _apply(retrain_epochs=2, t_warm=1, eta=2.0)
    with torch.inference_mode():
        model(_images(1))  # the shrink counts the budget on the last forward's input
    _shrink(model)
    retrain = _stage(model, "retrain")
    data = _data()
    retrain.before[0](model, lambda: iter(data))
    ib = model.blocks[-1].reducer.ib
    assert not ib.ready  # the bound starts after t_warm=1 epoch: no statistics pass yet
    images, labels = data[0]
    assert retrain.extra_loss(model, model(images), labels) is None
    retrain.epoch_end[0](model, 0, lambda: iter(data))
    assert ib.ready and int(ib.epochs_done) == 1
    with torch.no_grad():
        bound = retrain.extra_loss(model, model(images), labels)
        tau_f = soft_assign(final_features(model, images), ib.feature_centroids)
        tau_x = soft_assign(input_vectors(images), ib.input_centroids)
        expected = 2.0 * ib_terms(tau_f, tau_x, labels, 10, log_q=ib.log_q).bound
    assert torch.isfinite(bound) and math.isclose(bound.item(), expected.item(), rel_tol=1e-5)
    retrain.epoch_end[0](model, 1, lambda: iter(data))  # the last epoch: no refresh needed
    assert int(ib.epochs_done) == 2


@pytest.mark.parametrize("num_clusters, expected", [(3, 3), (None, 10)])
def test_kmeans_clusters_are_the_papers_a_b_c_and_the_bound_stays_finite(num_clusters, expected):
    """``clusters=kmeans`` (the DCS paper's A = B = C k-means): ``num_clusters`` centroids of the
    features and of the inputs (default: the class count), ``Q(a|y)`` ``[classes, clusters]``."""
    _, model = _apply(retrain_epochs=1, eta=1.0, clusters="kmeans", num_clusters=num_clusters)
    with torch.inference_mode():
        model(_images(1))
    _shrink(model)
    retrain = _stage(model, "retrain")
    data = _data()
    retrain.before[0](model, lambda: iter(data))
    ib = model.blocks[-1].reducer.ib
    assert ib.feature_centroids.shape[0] == ib.input_centroids.shape[0] == expected
    assert ib.log_q.shape == (10, expected)
    torch.testing.assert_close(ib.feature_centroids.norm(dim=1), torch.ones(expected))
    images, labels = data[0]
    with torch.no_grad():
        bound = retrain.extra_loss(model, model(images), labels)
        tau_f = soft_assign(final_features(model, images), ib.feature_centroids)
        tau_x = soft_assign(input_vectors(images), ib.input_centroids)
        expected_bound = ib_terms(tau_f, tau_x, labels, 10, log_q=ib.log_q).bound
    assert torch.isfinite(bound) and math.isclose(bound.item(), expected_bound.item(), rel_tol=1e-5)
    assert DCSParams().clusters == "class"


def test_a_non_timm_mlp_is_refused_clearly():
    from timm.layers import GluMlp

    model = vitbench.apply(tiny_vit(depth=2, mlp_layer=GluMlp), "dcs")
    with pytest.raises(UnsupportedError, match="needs a timm Mlp .* this block's MLP is a GluMlp"):
        model(_images(1))
    qk_only = vitbench.apply(tiny_vit(depth=2, mlp_layer=GluMlp), "dcs", arch="qk", budget=1.0)
    qk_only(_images(1))


@pytest.mark.parametrize("bad, message", [
    (dict(arch="mlp"), r"dcs.arch='mlp' is not valid; valid values: both, qk, out"),
    (dict(qk_mask="both"), r"dcs.qk_mask='both' is not valid; valid values: shared, separate"),
    (dict(optimizer="Lion"), r"dcs.optimizer='Lion' is not valid"),
    (dict(tau0=0), r"dcs.tau0=0.0 is out of range; it must be > 0"),
    (dict(tau_decay=1.5), r"dcs.tau_decay=1.5 is out of range; it must be in \(0, 1\]"),
    (dict(lam=-1), r"dcs.lam=-1.0 is out of range; it must be >= 0"),
    (dict(budget=0), r"dcs.budget=0.0 is out of range; it must be in \(0, 1\]"),
    (dict(budget=1.5), r"dcs.budget=1.5 is out of range; it must be in \(0, 1\]"),
    (dict(arch="qk", budget=0.9), r"dcs.budget=0.9 cannot be met with dcs.arch='qk': it drops no channel"),
    (dict(eta=-0.5), r"dcs.eta=-0.5 is out of range"),
    (dict(search_epochs=0), r"dcs.search_epochs=0 is out of range; it must be >= 1"),
    (dict(retrain_epochs=-1), r"dcs.retrain_epochs=-1 is out of range; it must be >= 0"),
    (dict(t_warm=-1), r"dcs.t_warm=-1 is out of range"),
    (dict(lr=0), r"dcs.lr=0.0 is out of range"),
    (dict(arch_lr=-1), r"dcs.arch_lr=-1.0 is out of range"),
    (dict(batch_size=0), r"dcs.batch_size=0 is out of range"),
    (dict(clusters="gmm"), r"^dcs.clusters='gmm' is not valid; valid values: class, kmeans$"),
    (dict(clusters="kmeans", num_clusters=0), r"^dcs.num_clusters=0 is out of range; it must be an integer >= 1"),
    (dict(num_clusters=4), r"^dcs.num_clusters=4 applies to clusters=kmeans only; valid with clusters=class: None"),
])
def test_bad_parameters(bad, message):
    with pytest.raises(ParamError, match=message):
        make_params("dcs", get_host().method("dcs").params, bad)


# -- EfficientViT (issue 4): Q/K masks of each LiteMLA branch, gates on the outputs feeding proj --

EV_SIZE = 64  # LiteMLA maps 4x4 (stages[2]) and 2x2 (stages[3])
EV_HW = [16] * 3 + [4] * 4
EV_DIMS = [128] * 3 + [256] * 4


@pytest.fixture()
def one_thread():
    """One thread: efficientvit_b1 runs several times faster so on the shared 2-core machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _efficientvit(num_classes: int = 10):  # type: ignore[no-untyped-def]
    import timm

    torch.manual_seed(0)
    return timm.create_model("efficientvit_b1", pretrained=False, num_classes=num_classes).eval()


def _ev_apply(**params):  # type: ignore[no-untyped-def]
    base = _efficientvit()
    return base, vitbench.apply(copy.deepcopy(base), "dcs", **{**MECHANICS, **params})


def _ev_images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, EV_SIZE, EV_SIZE, generator=torch.Generator().manual_seed(0))


def _ev_wrappers(model):  # type: ignore[no-untyped-def]
    from vitbench_plugins.efficientvit_family.adapter import ReducingLiteMLA

    return [m for m in model.modules() if isinstance(m, ReducingLiteMLA)]


def _ev_reducers(model):  # type: ignore[no-untyped-def]
    return [w.reducer for w in _ev_wrappers(model)]


def _ev_randomise(model, seed: int = 0) -> None:
    """Q/K masks that drop some channels per position, and random alphas."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for reducer in _ev_reducers(model):
            if reducer.qk_mask is not None:
                for lin in (m for m in reducer.qk_mask.modules() if isinstance(m, torch.nn.Linear)):
                    lin.weight.copy_(0.1 * torch.randn(lin.weight.shape, generator=g))
                    lin.bias.copy_(torch.randn(lin.bias.shape, generator=g))
            if reducer.out_gate is not None:
                reducer.out_gate.alpha.copy_(torch.randn(reducer.out_gate.alpha.shape, generator=g))


@pytest.mark.parametrize("params", [{}, {"qk_mask": "separate"}, {"arch": "qk"}, {"arch": "out"}])
def test_efficientvit_untrained_equals_unpatched(one_thread, params):
    base, model = _ev_apply(**params)
    x = _ev_images()
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))  # every mask and gate is exactly 1: nothing changes
        assert torch.equal(model.forward_features(x), base.forward_features(x))


def test_efficientvit_masks_have_the_branch_widths_and_keep_shapes(one_thread):
    base, model = _ev_apply()
    reducers = _ev_reducers(model)
    assert len(reducers) == 7
    assert [r.qk_mask.theta.weight.shape for r in reducers] == [(2 * c, c) for c in EV_DIMS]
    assert [(r.qk_mask.num_heads, r.qk_mask.head_dim) for r in reducers] == [(2 * c // 16, 16) for c in EV_DIMS]
    assert [r.out_gate.alpha.shape[0] for r in reducers] == [2 * c for c in EV_DIMS]
    names = {n.split("reducer.", 1)[1] for n, _ in model.named_parameters() if ".reducer." in n}
    assert names == {"qk_mask.theta.weight", "qk_mask.theta.bias", "out_gate.alpha"}
    _ev_randomise(model)
    x = _ev_images()
    with torch.inference_mode():
        out, masked = model(x), model.forward_features(x)
        assert out.shape == (2, 10) and masked.shape == (2, 256, 2, 2)
        assert not torch.allclose(out, base(x))  # the masks do act
        assert torch.equal(out, model(x))  # deterministic at inference


def test_efficientvit_gradients_reach_theta_and_alpha(one_thread):
    _, model = _ev_apply()
    model.train()
    x = _ev_images(4)
    labels = torch.tensor([0, 1, 2, 3])
    logits = model(x)
    cost = _stage(model, "search").extra_loss(model, logits, labels)
    # every channel kept, the Q/K mask Linears on top: over budget=1 by what the masks cost
    masks = sum(hw * c * 2 * c for hw, c in zip(EV_HW, EV_DIMS))
    baseline = count_gmacs(_efficientvit(), x[:1]).mean * 1e9
    assert cost.item() == pytest.approx(math.log((baseline + masks) / baseline), rel=1e-6)
    (F.cross_entropy(logits, labels) + cost).backward()
    for reducer in _ev_reducers(model):
        assert reducer.qk_mask.theta.weight.grad.abs().sum() > 0
        assert reducer.out_gate.alpha.grad.abs().sum() > 0


def _ev_settle(model) -> None:  # type: ignore[no-untyped-def]
    """Set the alphas to the decision the budget would take (a shrunk copy's), so that the shrink
    keeps exactly ``alpha > 0`` (the Q/K mask Linears cost more than the random decision saves)."""
    probe = copy.deepcopy(model)
    _shrink(probe, EV_SIZE)
    with torch.no_grad():
        for reducer, shrunk in zip(_ev_reducers(model), _ev_reducers(probe)):
            dropped = torch.ones_like(reducer.out_gate.alpha, dtype=torch.bool)
            dropped[shrunk.kept] = False
            reducer.out_gate.alpha[dropped] = -1.0


def test_efficientvit_shrink_cuts_proj_inputs_heads_and_qkv(one_thread):
    base, model = _ev_apply()
    _ev_randomise(model)
    with torch.no_grad():  # block 0 loses every output channel of heads 0..3 of the 1x1 branch
        _ev_reducers(model)[0].out_gate.alpha[:64] = -1.0  # and of heads 8..11 (5x5): pairs 0..3
        _ev_reducers(model)[0].out_gate.alpha[128:192] = -1.0
        _ev_reducers(model)[0].out_gate.alpha[64:128] = 3.0  # pairs 4..7 stay
        _ev_reducers(model)[0].out_gate.alpha[192:] = 3.0
    _ev_settle(model)
    alphas = [r.out_gate.alpha.detach().clone() for r in _ev_reducers(model)]
    x = _ev_images()
    with torch.inference_mode():
        masked = model(x)
    masked_gmacs = count_gmacs(model, x[:1]).mean
    _shrink(model, EV_SIZE)
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5
    for wrapper, reducer, alpha in zip(_ev_wrappers(model), _ev_reducers(model), alphas):
        kept = (alpha > 0).nonzero().flatten()
        proj = wrapper.block.proj
        full = base.get_submodule(next(n for n, m in model.named_modules() if m is wrapper)).proj
        assert 0 < len(kept) < len(alpha) and torch.equal(reducer.kept, kept)
        assert proj.conv.in_channels == len(kept) and torch.equal(proj.conv.weight, full.conv.weight[:, kept])
        assert torch.equal(reducer.heads_used, torch.unique(kept // 16))
        assert reducer.qk_mask.theta.weight.shape[0] == 16 * len(reducer.heads_used)
        assert reducer.out_gate is None
        pairs = torch.unique(reducer.heads_used % (len(alpha) // 32))
        assert torch.equal(reducer.pairs_used, pairs)  # the q/k/v of the other pairs are not computed
        qkv = wrapper.block.qkv.conv
        if len(pairs):
            rows = (pairs[:, None] * 48 + torch.arange(48)).flatten()
            full_qkv = base.get_submodule(next(n for n, m in model.named_modules() if m is wrapper)).qkv.conv
            assert qkv.out_channels == 48 * len(pairs) and torch.equal(qkv.weight, full_qkv.weight[rows])
            assert wrapper.block.aggreg[0][1].groups == 3 * len(pairs)
    assert _ev_reducers(model)[0].heads_used.tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    assert _ev_reducers(model)[0].pairs_used.tolist() == [4, 5, 6, 7]
    assert count_gmacs(model, x[:1]).mean < masked_gmacs
    keys = set(model.state_dict())
    assert set(base.state_dict()) <= keys and not any("alpha" in k for k in keys)
    assert "stages.2.blocks.1.context_module.main.reducer.kept" in keys


def test_efficientvit_shrink_saves_the_proj_skipped_head_and_pair_macs(one_thread):
    base, model = _ev_apply(arch="out")  # no Q/K mask: the only MACs DCS changes are the shrink's
    _ev_randomise(model)
    with torch.no_grad():
        _ev_reducers(model)[0].out_gate.alpha[:64] = -1.0
        _ev_reducers(model)[3].out_gate.alpha[256:] = -1.0  # the whole 5x5 branch
        _ev_reducers(model)[5].out_gate.alpha[:32] = -1.0  # pairs 0 and 1, both branches
        _ev_reducers(model)[5].out_gate.alpha[256:288] = -1.0
    x = _ev_images(1)
    assert count_gmacs(model, x).mean == pytest.approx(count_gmacs(base, x).mean, rel=1e-9)
    _shrink(model, EV_SIZE)
    expected = 0
    for hw, dim, reducer in zip(EV_HW, EV_DIMS, _ev_reducers(model)):
        dropped, skipped = 2 * dim - len(reducer.kept), 2 * dim // 16 - len(reducer.heads_used)
        pairs = dim // 16 - len(reducer.pairs_used)
        # proj reads hw x dim MACs per input channel; a head's linear attention costs
        # k^T [v 1] + q (k^T [v 1]): 2 x hw x d x (d + 1); a pair's q/k/v: 48 rows of the 1x1
        # qkv conv (dim inputs), of the 5x5 depthwise conv and of the grouped 1x1 conv (16 inputs)
        expected += hw * dim * dropped + skipped * 2 * hw * 16 * 17 + pairs * hw * 48 * (dim + 25 + 16)
    saved = count_gmacs(base, x).mean - count_gmacs(model, x).mean
    assert math.isclose(saved, expected / 1e9, rel_tol=1e-6)


def test_efficientvit_lite_mla_may_lose_every_channel(one_thread):
    _, model = _ev_apply()
    _ev_randomise(model)
    with torch.no_grad():
        _ev_reducers(model)[1].out_gate.alpha.fill_(-1.0)
    x = _ev_images()
    with torch.inference_mode():
        masked = model(x)
    _shrink(model, EV_SIZE)
    assert _ev_wrappers(model)[1].block.proj.conv.in_channels == 0
    assert _ev_reducers(model)[1].heads_used.numel() == 0
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5


def test_efficientvit_prepare_load_round_trip(one_thread):
    _, trained = _ev_apply()
    _ev_randomise(trained)
    _shrink(trained, EV_SIZE)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 3, EV_SIZE, EV_SIZE, generator=g), torch.randint(0, 10, (8,), generator=g))]
    _stage(trained, "retrain").before[0](trained, lambda: iter(data))
    state = trained.state_dict()
    last = "stages.3.blocks.4.context_module.main.reducer"
    assert state[f"{last}.ib.log_q"].shape == (10, 10) and state[f"{last}.ib.feature_centroids"].shape == (10, 256)
    _, fresh = _ev_apply()
    with pytest.raises(RuntimeError, match="size mismatch"):
        fresh.load_state_dict(state, strict=True)
    _, fresh = _ev_apply()
    reduction_context(fresh).reduction.prepare_load(fresh, state)
    fresh.load_state_dict(state, strict=True)
    x = _ev_images()
    with torch.inference_mode():
        assert torch.equal(fresh(x), trained(x))
    assert all(torch.equal(a.heads_used, b.heads_used) for a, b in zip(_ev_reducers(fresh), _ev_reducers(trained)))


def test_efficientvit_fine_tunes_search_then_retrain(one_thread, folder_writer, tmp_path):
    """The real loop (mmengine Runner) on a tiny image folder: both stages run, the search ends
    in the shrink within the budget, the retraining uses the IB bound of the last stage's map."""
    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.finetune import finetune

    for split in ("train", "val"):
        folder_writer(tmp_path / split, {"a": 8, "b": 8}, size=(EV_SIZE, EV_SIZE))
    base = _efficientvit(num_classes=2)
    base.pretrained_cfg = {**base.pretrained_cfg, "input_size": (3, EV_SIZE, EV_SIZE), "crop_pct": 1.0}
    model = vitbench.apply(copy.deepcopy(base), "dcs", arch="both", budget=0.95, batch_size=8, arch_lr=1.0)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if ".reducer." not in n}
    theta = _ev_reducers(model)[0].qk_mask.theta.weight.detach().clone()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = finetune(model, resolve_cls_data(str(tmp_path), model), limit=16)
    assert [(s["name"], s["iters"]) for s in result.stages] == [("search", 2), ("retrain", 2)]
    assert not [w for w in seen if "scheduler.step()" in str(w.message)]  # the arch steps skip step 0 by design
    assert result.stages[1]["last_extra"] != 0.0  # the IB bound was on
    reducers = _ev_reducers(model)
    assert all(r.kept is not None and r.out_gate is None for r in reducers)
    assert all(w.block.proj.conv.in_channels == len(r.kept) for w, r in zip(_ev_wrappers(model), reducers))
    assert reducers[-1].ib.ready and not model.stages[-1]._forward_hooks
    assert not torch.equal(reducers[0].qk_mask.theta.weight[:16], theta[:16])
    state = dict(model.named_parameters())
    for name, value in weights.items():  # the backbone stayed frozen (only lost channels)
        if not any(k in name for k in (".proj.conv.", ".qkv.conv.", ".aggreg.")):
            assert torch.equal(state[name], value), name
    with torch.inference_mode():
        assert model(_ev_images()).shape == (2, 2)
    x = _ev_images(1)
    assert count_gmacs(model, x).mean <= 0.95 * count_gmacs(base, x).mean


# -- MobileViT (issue 4): its ViT Blocks get the ViT reducers, sized per block --------------------

def _mobilevit_apply(**params):  # type: ignore[no-untyped-def]
    import timm

    torch.manual_seed(0)
    base = timm.create_model("mobilevit_xs", pretrained=False, num_classes=10).eval()
    return base, vitbench.apply(copy.deepcopy(base), "dcs", **{**MECHANICS, **params})


def _mobilevit_reducers(model):  # type: ignore[no-untyped-def]
    from vitbench.engine import ReducingBlock

    return [m.reducer for m in model.modules() if isinstance(m, ReducingBlock)]


def test_mobilevit_reducers_are_sized_per_block_and_start_as_the_identity(one_thread):
    base, model = _mobilevit_apply()
    reducers = _mobilevit_reducers(model)
    dims = [96] * 2 + [120] * 4 + [144] * 3
    assert [r.qk_mask.theta.weight.shape for r in reducers] == [(d, d) for d in dims]
    assert [r.mlp_gate.alpha.numel() for r in reducers] == dims
    x = _ev_images()
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))


def test_mobilevit_shrink_prepare_load_and_ib_bound(one_thread):
    _, model = _mobilevit_apply(eta=2.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for reducer in _mobilevit_reducers(model):
            reducer.qk_mask.theta.weight.copy_(0.1 * torch.randn(reducer.qk_mask.theta.weight.shape, generator=g))
            reducer.mlp_gate.alpha.copy_(torch.randn(reducer.mlp_gate.alpha.shape, generator=g))
    x = _ev_images()
    with torch.inference_mode():
        masked = model(x)
    masked_gmacs = count_gmacs(model, x[:1]).mean
    _shrink(model, EV_SIZE)
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5
    assert count_gmacs(model, x[:1]).mean < masked_gmacs
    mlp = model.stages[3][1].transformer[0].block.mlp
    assert mlp.fc1.in_features == len(_mobilevit_reducers(model)[2].kept) < 120
    data = [(torch.randn(8, 3, EV_SIZE, EV_SIZE, generator=g), torch.randint(0, 10, (8,), generator=g))]
    retrain = _stage(model, "retrain")
    retrain.before[0](model, lambda: iter(data))  # the statistics of the last stage's pooled map
    ib = _mobilevit_reducers(model)[-1].ib
    assert ib.ready and ib.feature_centroids.shape == (10, model.stages[-1][-1].conv_fusion.conv.out_channels)
    images, labels = data[0]
    with torch.no_grad():
        bound = retrain.extra_loss(model, model(images), labels)
        captured = []
        handle = model.stages[-1].register_forward_hook(lambda m, a, out: captured.append(out.mean(dim=(2, 3))))
        model(images)
        handle.remove()
        tau_f = soft_assign(captured[0], ib.feature_centroids)
        tau_x = soft_assign(input_vectors(images), ib.input_centroids)
        expected = 2.0 * ib_terms(tau_f, tau_x, labels, 10, log_q=ib.log_q).bound
    assert math.isclose(bound.item(), expected.item(), rel_tol=1e-5)
    retrain.after[0](model)
    assert not model.stages[-1]._forward_hooks
    state = model.state_dict()
    _, fresh = _mobilevit_apply(eta=2.0)
    reduction_context(fresh).reduction.prepare_load(fresh, state)
    fresh.load_state_dict(state, strict=True)
    with torch.inference_mode():
        assert torch.equal(fresh(x), model(x))


# -- Swin (issue 12): DCS's hooks on the window attention and on the MLP of the whole map ------

SWIN_SIZE = 56  # maps 14 (two windows a side, the second block shifted) and 7


def _small_swin():  # type: ignore[no-untyped-def]
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(img_size=SWIN_SIZE, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                           num_classes=10).eval()


def test_swin_untrained_is_the_unpatched_model_and_the_ib_bound_reads_the_last_stage(one_thread):
    """Untrained masks keep everything (both hooks run: Q/K in every window, the gate on the MLP);
    after a shrink the masked outputs stay; the retraining's bound pools Swin's last stage, a
    channels-last map, over its positions."""
    base = _small_swin()
    model = vitbench.apply(copy.deepcopy(base), "dcs", **MECHANICS, eta=2.0)
    x = torch.randn(2, 3, SWIN_SIZE, SWIN_SIZE, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))
    _randomise(model)
    with torch.inference_mode():
        masked = model(x)
    _shrink(model, SWIN_SIZE)
    with torch.inference_mode():
        assert (model(x) - masked).abs().max().item() < 1e-5
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 3, SWIN_SIZE, SWIN_SIZE, generator=g), torch.randint(0, 10, (8,), generator=g))]
    retrain = _stage(model, "retrain")
    retrain.before[0](model, lambda: iter(data))
    ib = _dcs_reducers(model)[-1].ib
    assert ib.ready and ib.feature_centroids.shape == (10, 32)
    images, labels = data[0]
    with torch.no_grad():
        bound = retrain.extra_loss(model, model(images), labels)
        pooled = model.layers[-1](model.layers[0](model.patch_embed(images))).mean(dim=(1, 2))
        tau_f = soft_assign(pooled, ib.feature_centroids)
        tau_x = soft_assign(input_vectors(images), ib.input_centroids)
        expected = 2.0 * ib_terms(tau_f, tau_x, labels, 10, log_q=ib.log_q).bound
    assert math.isclose(bound.item(), expected.item(), rel_tol=1e-5)


# -- the compute budget (issue 9): a cost that is the counted GMACs, a shrink that meets it -------

def _family(name: str, **params):  # type: ignore[no-untyped-def]
    """(base, patched model, image size) of a tiny model of each family DCS supports."""
    if name == "vit":
        base = tiny_vit(depth=DEPTH)
        return base, vitbench.apply(copy.deepcopy(base), "dcs", **params), 32
    if name == "swin":
        base = _small_swin()
        return base, vitbench.apply(copy.deepcopy(base), "dcs", **params), SWIN_SIZE
    import timm

    torch.manual_seed(0)
    base = timm.create_model(name, pretrained=False, num_classes=10).eval()
    return base, vitbench.apply(copy.deepcopy(base), "dcs", **params), EV_SIZE


def _dcs_reducers(model):  # type: ignore[no-untyped-def]
    from vitbench_plugins.dcs.reduction import dcs_reducers

    return dcs_reducers(model)


def _before(model, x) -> None:  # type: ignore[no-untyped-def]
    """The search's ``before`` callbacks on a one-batch data set (the budget's count)."""
    for callback in _stage(model, "search").before:
        callback(model, lambda: iter([(x, torch.zeros(len(x), dtype=torch.long))]))


@pytest.mark.parametrize("family, params", [
    ("vit", {"arch": "out"}), ("vit", {"arch": "both", "qk_mask": "separate", "budget": 0.95}),
    ("efficientvit_b1", {"arch": "both", "budget": 0.95}), ("efficientvit_b1", {}), ("mobilevit_xs", {}),
    ("swin", {}), ("swin", {"arch": "both", "budget": 0.95}),
])
def test_the_cost_model_is_the_counted_gmacs(one_thread, family, params):
    """Before the search (Q/K mask Linears included), at the baseline and after the shrink, the
    cost model's MACs equal what vitbench.measure.count_gmacs counts on the model."""
    base, model, size = _family(family, **params)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(3))
    _before(model, x)
    reducers = _dcs_reducers(model)
    cost = reducers[0].compute_budget
    assert cost.baseline / 1e9 == pytest.approx(count_gmacs(base, x).mean, rel=1e-6)
    assert cost.current() / 1e9 == pytest.approx(count_gmacs(model, x).mean, rel=1e-6)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a searched decision: about a third of the channels dropped
        for r in reducers:
            alpha = r.mlp_gate.alpha if hasattr(r, "mlp_gate") else r.out_gate.alpha
            alpha.copy_(torch.randn(alpha.shape, generator=g) + 0.5)
    _stage(model, "search").after[0](model)
    assert all(r.kept is not None for r in reducers)
    assert cost.current() / 1e9 == pytest.approx(count_gmacs(model, x).mean, rel=1e-6)


@pytest.mark.parametrize("family", ["vit", "efficientvit_b1", "mobilevit_xs", "swin"])
def test_the_default_shrink_meets_the_budget_on_every_family(one_thread, family, caplog):
    """With the defaults (arch=out, budget=0.9) and a search that dropped nothing, the shrink
    still lands at or under 90% of the baseline's counted GMACs, and says so in the log."""
    base, model, size = _family(family)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(3))
    _before(model, x)
    with caplog.at_level("WARNING", logger="vitbench.dcs"):
        _stage(model, "search").after[0](model)
    assert count_gmacs(model, x).mean <= 0.9 * count_gmacs(base, x).mean
    assert re.search(r"dcs: the search kept .* \(1\.000 of the baseline's .*\), over budget=0\.9; "
                     r"dropped \d+ more kept channels", caplog.text)
    result = _dcs_reducers(model)[0].budget_result
    assert result.extra_dropped > 0 and result.final_macs <= 0.9 * result.searched_macs


def test_a_search_within_budget_keeps_its_own_decision():
    base, model = _apply(arch="out", budget=0.9)
    x = _images(1)
    _before(model, x)
    with torch.no_grad():
        for reducer in _reducers(model):
            reducer.mlp_gate.alpha[:20] = -1.0  # 20 of 48 channels: 40% of every MLP
    kept = [(r.mlp_gate.alpha > 0).nonzero().flatten() for r in _reducers(model)]
    _stage(model, "search").after[0](model)
    assert all(torch.equal(r.kept, k) for r, k in zip(_reducers(model), kept))
    assert _reducers(model)[0].budget_result.extra_dropped == 0
    assert count_gmacs(model, x).mean <= 0.9 * count_gmacs(base, x).mean


def test_a_budget_the_model_cannot_reach_is_refused_before_training():
    _, model = _apply(arch="both", budget=0.5)
    with pytest.raises(ParamError, match=r"dcs.budget=0.5 cannot be met on this model: dropping every "
                                         r"channel dcs may drop still leaves 0\.\d+ of the baseline's "
                                         r".* GMACs; valid: 0\.\d+ <= budget <= 1"):
        _before(model, _images(1))


def test_defaults_are_a_budget_on_the_mlp_channels():
    """arch=out (the Q/K mask Linears cost N*C^2 per block and save nothing in a dense forward),
    budget=0.9: one search stage, which measures the budget before and enforces it after."""
    params = make_params("dcs", get_host().method("dcs").params, {})
    assert (params.arch, params.budget) == ("out", 0.9)
    _, model = _apply(arch=params.arch, budget=params.budget)
    (search,) = reduction_context(model).reduction.train
    assert search.name == "search" and len(search.before) == 1 and len(search.after) == 1
