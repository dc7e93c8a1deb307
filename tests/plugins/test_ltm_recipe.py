"""LTM as its authors ran it (docs/methods.md §5): k-means clusters, the official recipe (IB weight
0.1 after a 30 % warm-up, label smoothing 0.1), and the IB term trained on the ``ib`` metric's
features on every family."""
from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer
from vitbench_plugins.ltm import LTMParams
from vitbench_plugins.ltm.reduction import (
    FEATURES_KEY, FirstMerge, ReMerge, _feature_hook, feature_module, ib_weight_at,
)

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.measure.ib import feature_source, final_features
from vitbench.testing import tiny_vit

P = 45  # ceil(0.7 * 64)
D = 48  # tiny_vit's width


def _data(batch: int = 20, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(batch, 3, 32, 32, generator=g), torch.arange(batch) % 10)]
    return lambda: iter(data)


def _stage(model):
    return reduction_context(model).reduction.train[0]


def _ltm(**params):
    model = vitbench.apply(tiny_vit(0), "ltm", **params)
    _stage(model).before[0](model, _data())
    return model


def test_kmeans_gives_num_clusters_clusters_everywhere_and_a_finite_loss():
    model = _ltm(clusters="kmeans", num_clusters=4)
    first, later = model.blocks[0].reducer, [b.reducer for b in model.blocks[1:]]
    assert isinstance(first, FirstMerge) and all(isinstance(r, ReMerge) for r in later)
    assert first.feature_centroids.shape == (4, D) and first.input_centroids.shape[0] == 4
    assert first.feature_log_q.shape == (10, 4)  # rows: the classes y, columns: the clusters a
    assert all(r.centroids.shape == (4, P, D) and r.log_q.shape == (10, 4) for r in later)
    torch.testing.assert_close(first.feature_centroids.norm(dim=1), torch.ones(4))
    images, labels = next(_data()())
    model.train()
    ctx = reduction_context(model)
    ctx.labels = labels
    logits = model(images)
    loss = F.cross_entropy(logits, labels) + _stage(model).extra_loss(model, logits, labels)
    ctx.labels = None
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.isfinite(first.logits.grad).all() and first.logits.grad.abs().sum() > 0


def test_kmeans_defaults_to_the_class_count_and_class_stays_the_default():
    assert LTMParams().clusters == "class" and LTMParams().recipe == "tuned"
    model = _ltm(clusters="kmeans")
    assert model.blocks[0].reducer.feature_centroids.shape[0] == 10
    assert model.blocks[1].reducer.centroids.shape[0] == 10


@pytest.mark.parametrize("bad, message", [
    ({"clusters": "dbscan"}, r"^ltm.clusters='dbscan'; valid values: class, kmeans$"),
    ({"recipe": "paper"}, r"^ltm.recipe='paper'; valid values: tuned, official$"),
    ({"clusters": "kmeans", "num_clusters": 0}, r"^ltm.num_clusters=0 is out of range; it must be >= 1"),
    ({"num_clusters": 5}, r"^ltm.num_clusters=5 applies to clusters=kmeans only; valid with clusters=class: None"),
])
def test_bad_cluster_and_recipe_parameters(bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "ltm", **bad)


def test_the_official_schedule_is_off_for_the_first_30_percent_of_the_epochs():
    assert [ib_weight_at(e, 10, 0.1, 0.3) for e in range(10)] == [0.0] * 3 + [0.1] * 7
    assert [ib_weight_at(e, 4, 0.1, 0.3) for e in range(4)] == [0.0, 0.1, 0.1, 0.1]  # int(1.2) = 1 epoch off
    assert [ib_weight_at(e, 2, 0.1, 0.3) for e in range(2)] == [0.1, 0.1]  # int(0.6) = 0: no warm-up
    assert [ib_weight_at(e, 3, 1.0, 0.0) for e in range(3)] == [1.0] * 3  # tuned: on from the start
    official = LTMParams(recipe="official").schedule
    assert (official.ib_weight, official.ib_warmup, official.label_smoothing) == (0.1, 0.3, 0.1)
    tuned = LTMParams().schedule
    assert (tuned.ib_weight, tuned.ib_warmup, tuned.label_smoothing) == (1.0, 0.0, 0.0)
    assert LTMParams(recipe="official", ib_weight=0.5).schedule.ib_weight == 0.5  # an explicit weight wins


def test_the_official_recipe_trains_everything_at_2e_4_and_ends_on_the_moving_average():
    """The authors' harness: AdamW 2e-4 for masks, scales and the IB step's MLPs, weight decay
    0.01, cosine down to 2e-5, EMA 0.9995; ours: 0.3 for masks and scales, MLPs frozen, no decay."""
    official = _stage(vitbench.apply(tiny_vit(0), "ltm", recipe="official"))
    assert (official.lr, official.lr_groups, official.trainable) == (2e-4, ((".reducer.mlp.", 2e-4),), None)
    assert (official.weight_decay, official.min_lr_ratio, official.ema_decay) == (0.01, 0.1, 0.9995)
    tuned = _stage(vitbench.apply(tiny_vit(0), "ltm"))
    assert (tuned.lr, tuned.lr_groups, tuned.weight_decay, tuned.ema_decay) == (0.3, (), 0.0, None)
    assert ".reducer.mlp." not in "".join(tuned.trainable)
    given = _stage(vitbench.apply(tiny_vit(0), "ltm", recipe="official", lr=0.01, mlp_lr=0.0))
    assert (given.lr, given.lr_groups, given.trainable) == (0.01, (), tuned.trainable)  # explicit rates win


def test_the_official_recipe_smooths_the_labels_and_switches_the_ib_term_on_after_the_warm_up():
    from vitbench.tasks.cls.finetune import MethodTrainer

    model = _ltm(recipe="official", epochs=4)
    stage = _stage(model)
    assert stage.label_smoothing == 0.1
    trainer = MethodTrainer(model, stage, torch.nn.Identity())
    images, labels = next(_data()())
    with torch.no_grad():
        losses = trainer.losses(images, labels)  # epoch 0 of 4: in the warm-up (int(0.3 * 4) = 1 epoch)
        logits = model(images)
    plain = F.cross_entropy(logits, labels)
    smooth = 0.9 * plain + 0.1 * -logits.log_softmax(dim=-1).mean(dim=-1).mean()
    torch.testing.assert_close(losses["ce"], smooth)
    assert not torch.allclose(losses["ce"], plain) and "extra" not in losses
    stage.epoch_end[0](model, 0, _data())  # epoch 0 done: epoch 1 uses the IB term
    with torch.no_grad():
        losses = trainer.losses(images, labels)
    assert "extra" in losses and math.isfinite(losses["extra"].item())
    bound = _stage(model).extra_loss(model, logits, labels)
    torch.testing.assert_close(losses["extra"], bound)
    tuned = _stage(_ltm(epochs=2))
    assert tuned.label_smoothing == 0.0


def _mobilevit():
    torch.manual_seed(0)
    model = timm.create_model("mobilevit_xs", pretrained=False, num_classes=10).eval()
    model.vitbench_input_size = (64, 64)
    return model, torch.randn(2, 3, 64, 64)


def _swin():
    torch.manual_seed(0)
    model = SwinTransformer(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                            num_classes=10).eval()
    return model, torch.randn(2, 3, 56, 56)


def _vit():
    return tiny_vit(0), torch.randn(2, 3, 32, 32)


def _efficientvit():
    torch.manual_seed(0)
    model = timm.create_model("efficientvit_b1", pretrained=False, num_classes=10).eval()
    model.vitbench_input_size = (64, 64)
    return model, torch.randn(2, 3, 64, 64)


@pytest.mark.parametrize("family, make, module", [
    ("vit", _vit, lambda m: m.blocks[-1]),
    ("mobilevit", _mobilevit, lambda m: m.stages[-1]),
    ("swin", _swin, lambda m: m.layers[-1]),
    ("efficientvit", _efficientvit, lambda m: m.stages[-1]),
])
def test_the_ib_term_trains_on_the_tensor_the_ib_metric_reads(family, make, module):
    """One function picks the features (:func:`vitbench.measure.ib.feature_source`): the training
    term's hook and the metric read the same module's output, pooled the same way."""
    base, images = make()
    model = vitbench.apply(base, "ltm", ratio=0.5)
    assert feature_module(model)[0] is feature_source(model)[0] is module(model)
    handle = _feature_hook(model)
    try:
        with torch.no_grad():
            model(images)
            trained = reduction_context(model).extras[FEATURES_KEY]
            reported = final_features(model, images)
    finally:
        handle.remove()
    assert trained.shape == reported.shape == (2, trained.shape[1])
    torch.testing.assert_close(trained, reported, rtol=0, atol=0)


def test_the_refresh_and_the_warm_up_count_the_epochs_the_task_runs_the_stage_for(monkeypatch):
    """A dense task lengthens LTM's stage (2 declared epochs, 8 run, ``ctx.stage``): the statistics
    are refreshed after every epoch but the last of the 8, and the official IB warm-up is 30 % of
    the 8 (2 epochs off), not of the 2 (none off)."""
    import dataclasses

    from vitbench_plugins.ltm import reduction as ltm_reduction

    model = _ltm(recipe="official", epochs=2)
    stage, ctx = _stage(model), reduction_context(model)
    images, labels = next(_data()())
    refreshed = []
    monkeypatch.setattr(ltm_reduction, "refresh_statistics", lambda m, batches, n: refreshed.append(n))
    for run in (None, dataclasses.replace(stage, epochs=8)):  # as declared (cls), as a dense task runs it
        ctx.stage = run
        epochs = stage.epochs if run is None else run.epochs
        refreshed.clear()
        for epoch in range(epochs):
            stage.epoch_end[0](model, epoch, _data())
        assert len(refreshed) == epochs - 1
        model.blocks[0].reducer._shared.epoch = 1  # the second epoch
        model.train()
        logits = model(images)
        ib = stage.extra_loss(model, logits, labels)
        assert (ib is None) == (run is not None)  # 8 epochs: int(0.3 * 8) = 2 off; 2 epochs: int(0.6) = 0
    ctx.stage = None
