"""LTMP's calibration at matched compute (docs/methods.md §2 "Calibration"): after training one
scale of every block's thresholds is searched so that training images' mean counted GMACs land on
the goal; the stage is declared only where ``calibrate`` asks for it."""
from __future__ import annotations

import logging

import pytest
import torch
from tests_support import sharp_vit as _sharp_vit
from timm.models.swin_transformer import SwinTransformer
from vitbench_plugins.ltmp import calibration
from vitbench_plugins.ltmp.reduction import LTMPReducer

import vitbench
from vitbench.engine import reduction_context
from vitbench.measure import count_gmacs
from vitbench.testing import tiny_vit

pytestmark = pytest.mark.usefixtures("single_thread")


def _reducers(model):
    return [m for m in model.modules() if isinstance(m, LTMPReducer)]


def _images(n, size=32, seed=0):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _batches(images, labels=None):
    labels = torch.zeros(len(images), dtype=torch.long) if labels is None else labels
    return lambda: iter([(images[i : i + 8], labels[i : i + 8]) for i in range(0, len(images), 8)])


def _stages(model):
    return reduction_context(model).reduction.train


def _counted_fraction(model, base, images):
    """The mean over ``images`` of each image's counted GMACs over the baseline's (the report's count)."""
    per_image = [count_gmacs(model, images[i : i + 1]).mean for i in range(len(images))]
    return sum(per_image) / len(per_image) / count_gmacs(base, images[:1]).mean


@pytest.mark.parametrize("calibrate, fraction, names", [
    ("matched", 0.7, ["thresholds", "calibration"]),
    ("matched", None, ["thresholds"]),  # the paper's target: as the paper, no calibration
    ("always", None, ["thresholds", "calibration"]),
    ("never", 0.7, ["thresholds"]),
])
def test_the_calibration_stage_follows_calibrate(calibrate, fraction, names):
    model = vitbench.apply(tiny_vit(), "ltmp", calibrate=calibrate, gmacs_fraction=fraction)
    stages = _stages(model)
    assert [s.name for s in stages] == names
    if len(stages) == 2:
        assert stages[1].epochs == 0 and stages[1].before and stages[1].trainable == ("theta_m", "theta_p")


def test_scale_one_keeps_the_trained_thresholds_and_zero_reduces_nothing():
    model = vitbench.apply(_sharp_vit(), "ltmp", gmacs_fraction=0.7)
    reducers = _reducers(model)
    trained = [(0.2 + 0.05 * i, 0.01 * (i % 3)) for i in range(len(reducers))]
    calibration.scale_thresholds(reducers, trained, 1.0)
    assert [float(r.theta_m) for r in reducers] == pytest.approx([m for m, _ in trained])
    assert [float(r.theta_p) for r in reducers] == pytest.approx([p for _, p in trained])
    calibration.scale_thresholds(reducers, trained, 0.0)
    assert all(float(r.theta_m) == 1.0 and float(r.theta_p) == 0.0 for r in reducers)
    calibration.scale_thresholds(reducers, trained, 10.0)  # clamped to [0, 1]
    assert all(float(r.theta_m) == 0.0 for r in reducers)
    assert [float(r.theta_p) for r in reducers] == pytest.approx([min(10 * p, 1.0) for _, p in trained])


@pytest.mark.parametrize("start, goal", [(0.9, 0.6), (0.05, 0.8)])  # reduces too little / too much
def test_the_stage_lands_the_counted_gmacs_on_the_goal(start, goal, monkeypatch):
    monkeypatch.setattr(calibration, "IMAGES", 32)  # the first 32 of the 48 images it is handed
    base = _sharp_vit()
    model = vitbench.apply(_sharp_vit(), "ltmp", gmacs_fraction=goal)
    for r in _reducers(model):
        r.theta_m.data.fill_(start)
    images = _images(48)
    before = _counted_fraction(model.eval(), base, images[:16])
    stage = _stages(model)[1]
    with torch.no_grad():
        found = stage.before[0](model.eval(), _batches(images))
    assert abs(before - goal) > 0.05  # the trained thresholds were off the goal
    assert found["calibration_images"] == 32
    assert abs(found["calibration_ratio"] - goal) <= calibration.TOLERANCE * goal
    # the ratio it searched on is the counter's, image by image
    assert _counted_fraction(model, base, images[:32]) == pytest.approx(found["calibration_ratio"], rel=1e-9)
    # one scale for every block: the distances 1 - theta_m keep their trained proportions
    alpha = found["calibration_alpha"]
    assert all(float(r.theta_m) == pytest.approx(max(1 - alpha * (1 - start), 0.0)) for r in _reducers(model))


def test_a_goal_out_of_reach_keeps_the_nearest_end_and_warns(caplog):
    # thresholds trained to reduce nothing (theta_m = 1, theta_p = 0): no scale moves them
    model = vitbench.apply(_sharp_vit(), "ltmp", gmacs_fraction=0.5)
    for r in _reducers(model):
        r.theta_m.data.fill_(1.0)
        r.theta_p.data.fill_(0.0)
    with caplog.at_level("WARNING", logger="vitbench.ltmp"), torch.no_grad():
        found = _stages(model)[1].before[0](model.eval(), _batches(_images(64)))
    assert found["calibration_ratio"] > 0.9
    assert all(float(r.theta_m) == 1.0 and float(r.theta_p) == 0.0 for r in _reducers(model))
    assert any(rec.levelno == logging.WARNING and "goal 0.5000" in rec.getMessage() for rec in caplog.records)


def test_swin_lands_the_counted_gmacs_on_the_goal():
    torch.manual_seed(0)
    swin = lambda: SwinTransformer(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2),
                                   window_size=7, num_classes=10, drop_path_rate=0.0).eval()
    base = swin()
    model = vitbench.apply(swin(), "ltmp", gmacs_fraction=0.93)
    model.load_state_dict(base.state_dict(), strict=False)
    for r in _reducers(model):
        r.theta_m.data.fill_(0.5)
        r.theta_p.data.fill_(0.0)
    images = _images(32, size=56)
    with torch.no_grad():
        found = _stages(model)[1].before[0](model.eval(), _batches(images))
    assert abs(found["calibration_trained_ratio"] - 0.93) > 0.05
    assert abs(found["calibration_ratio"] - 0.93) <= calibration.TOLERANCE * 0.93
    assert _counted_fraction(model, base, images) == pytest.approx(found["calibration_ratio"], rel=1e-6)
