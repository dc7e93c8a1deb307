"""Training and evaluation of the dense tasks on a tiny generated set (4+4 images at 64 px):
dominant labels, the default training, CocoMetric mAP, and a learnable method fine-tuned on the
detection loss with everything but its own parameters (BatchNorm statistics included) frozen."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.structures import InstanceData
from torch import nn

import vitbench
from vitbench.errors import VitbenchError
from vitbench.tasks.dense.detectors import build_detector
from vitbench.tasks.dense.evaluate import evaluate_detector, first_val_images
from vitbench.tasks.dense.protocol import DenseFinetune
from vitbench.tasks.dense.run import load_detector_weights
from vitbench.tasks.dense.train import DetMethodTrainer, dominant_labels, finetune_method, train_detector

BOX_KEYS = ("box_map", "box_ap50", "box_ap75")
MASK_KEYS = ("mask_map", "mask_ap50", "mask_ap75")


def _sample(boxes, labels, wrap: bool = False) -> DetDataSample:
    sample = DetDataSample()
    gt = InstanceData()
    tensor = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    gt.bboxes = HorizontalBoxes(tensor) if wrap else tensor
    gt.labels = torch.tensor(labels, dtype=torch.long)
    sample.gt_instances = gt
    return sample


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_dominant_labels_take_the_largest_box():
    samples = [
        _sample([[0, 0, 10, 10], [0, 0, 30, 20], [5, 5, 20, 20]], [0, 2, 1]),  # 100, 600, 225 -> label 2
        _sample([[0, 0, 50, 2], [0, 0, 9, 9]], [1, 0], wrap=True),  # 100 vs 81 (HorizontalBoxes)
        _sample([], []),  # no object -> 0
        _sample([[3, 3, 4, 40]], [2]),
    ]
    labels = dominant_labels(samples)
    assert labels.dtype == torch.long and labels.tolist() == [2, 1, 0, 2]
    assert dominant_labels([]).tolist() == []


@pytest.mark.parametrize("task", ["det", "seg"])
def test_train_then_evaluate(backbone_factory, det_data, task):
    masks = task == "seg"
    detector = build_detector(task, backbone_factory("mobilevit_xs"), det_data.num_classes, width="light")
    before = _state(detector)
    info = train_detector(detector, det_data, masks=masks, epochs=1, batch_size=2, verbose=False)
    assert {k: info[k] for k in ("epochs", "iters", "images", "batch_size")} == \
        {"epochs": 1, "iters": 2, "images": 4, "batch_size": 2}
    assert info["lr"] > 0 and info["seconds"] >= 0
    assert not detector.training
    after = _state(detector)
    assert not torch.equal(before["backbone.model.stem.conv.weight"], after["backbone.model.stem.conv.weight"])
    metrics = evaluate_detector(detector, det_data, masks=masks, batch_size=2)
    keys = BOX_KEYS + (MASK_KEYS if masks else ())
    assert set(metrics) == set(keys) | {"num_images", "num_classes"}
    assert all(isinstance(metrics[k], float) and 0.0 <= metrics[k] <= 1.0 for k in keys)
    assert metrics["num_images"] == 4 and metrics["num_classes"] == 3
    assert evaluate_detector(detector, det_data, masks=masks, batch_size=2, limit=2)["num_images"] == 2


def test_train_limit_counts_images(backbone_factory, det_data):
    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    info = train_detector(detector, det_data, masks=False, epochs=2, batch_size=2, limit=2, verbose=False)
    assert info["images"] == 2 and info["iters"] == 2 and info["epochs"] == 2


@pytest.mark.parametrize("kwargs, shown", [({"batch_size": 1}, "batch size=1"), ({"epochs": 0}, "epochs=0")])
def test_bad_training_settings_are_clear_errors(backbone_factory, det_data, kwargs, shown):
    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    args = {"epochs": 1, "batch_size": 2, **kwargs}
    with pytest.raises(VitbenchError, match="needs epochs >= 1 and batch size >= 2") as err:
        train_detector(detector, det_data, masks=False, verbose=False, **args)
    assert shown in str(err.value)


def test_first_val_images_are_what_the_backbone_sees(backbone_factory, det_data):
    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    images = first_val_images(detector, det_data, 3)
    assert tuple(images.shape) == (3, 3, 64, 64) and images.dtype == torch.float32
    assert images.abs().max() < 10 and images.mean().abs() < 2  # normalised, not 0..255
    assert tuple(first_val_images(detector, det_data, 1).shape) == (1, 3, 64, 64)


def test_method_trainer_keeps_frozen_batchnorm_in_eval(backbone_factory):
    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    bns = [m for m in detector.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    trainable = bns[-1]
    for p in detector.parameters():
        p.requires_grad_(False)
    for p in trainable.parameters():
        p.requires_grad_(True)
    trainer = DetMethodTrainer(detector, detector.backbone.model, SimpleNamespace())
    trainer.train()
    assert trainer.training and detector.training and trainable.training
    assert not any(bn.training for bn in bns[:-1])
    assert any(m.training for m in detector.modules() if not isinstance(m, nn.modules.batchnorm._BatchNorm))
    trainer.train(False)
    assert not any(m.training for m in detector.modules())


def test_finetune_needs_a_reduced_backbone(backbone_factory, det_data):
    backbone = backbone_factory("mobilevit_xs")
    detector = build_detector("det", backbone, 3, width="light")
    with pytest.raises(VitbenchError, match="needs a backbone reduced with vitbench.apply"):
        finetune_method(detector, backbone, det_data, masks=False)


def _reduced_detector(backbone_factory, method, params, task="det"):
    """A trained-like baseline detector's weights loaded into one around the reduced backbone."""
    backbone = backbone_factory("mobilevit_xs")
    baseline = build_detector(task, copy.deepcopy(backbone), 3, width="light")
    baseline.init_weights()
    reduced = vitbench.apply(backbone, method, **params)
    detector = build_detector(task, reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    return detector, reduced


@pytest.mark.parametrize("method, params", [
    # LTM without its IB loss: the IB path is test_finetune_ltm_with_the_ib_loss below
    ("ltm", {"ratio": 0.5, "epochs": 1, "batch_size": 2, "stats_images": 4, "ib_weight": 0.0}),
    # DCS's search: arch/weight alternation on two optimisers, then the search's shrink
    ("dcs", {"search_epochs": 1, "retrain_epochs": 0, "batch_size": 2}),
])
def test_finetune_trains_only_the_method(backbone_factory, det_data, method, params):
    detector, reduced = _reduced_detector(backbone_factory, method, params)
    before = _state(detector)
    grads = {n: p.requires_grad for n, p in detector.named_parameters()}
    info = finetune_method(detector, reduced, det_data, masks=False, limit=4)
    assert info["trained"] == "fine-tuned" and info["trainable_params"] > 0 and info["train_images"] == 4
    stage = info["train_stages"][0]
    assert stage["iters"] == 2 and stage["images"] == 4 and "last_loss" in stage
    after = _state(detector)
    frozen = [k for k in before if ".reducer." not in k]
    assert any(k.endswith("running_mean") for k in frozen) and any(k.startswith("bbox_head.") for k in frozen)
    # DCS's shrink after its search drops channels of backbone layers (a smaller tensor, by design)
    shrunk = [k for k in frozen if before[k].shape != after[k].shape]
    assert all(k.startswith("backbone.model.") for k in shrunk)
    changed = [k for k in frozen if k not in shrunk and not torch.equal(before[k], after[k])]
    assert changed == []  # backbone, neck and head weights and BatchNorm statistics: bitwise equal
    method_params = [n for n, _ in detector.named_parameters() if ".reducer." in n and n in before]
    # the method trained: its parameters moved, or (DCS, arch=out) its search decided a shrink
    assert any(not torch.equal(before[n], after[n]) for n in method_params) or shrunk
    now = {n: p.requires_grad for n, p in detector.named_parameters()}
    assert now == {n: grads[n] for n in now}  # restored (DCS's shrink drops its searched gates)
    assert not detector.training


def test_finetune_ltm_with_the_ib_loss(backbone_factory, det_data):
    params = {"ratio": 0.5, "epochs": 1, "batch_size": 2, "stats_images": 4}
    detector, reduced = _reduced_detector(backbone_factory, "ltm", params)
    info = finetune_method(detector, reduced, det_data, masks=False, limit=4)
    assert "last_extra" in info["train_stages"][0]


def test_finetune_inside_a_seg_detector(backbone_factory, det_data):
    params = {"ratio": 0.5, "epochs": 1, "batch_size": 2, "stats_images": 4, "ib_weight": 0.0}
    detector, reduced = _reduced_detector(backbone_factory, "ltm", params, task="seg")
    before = _state(detector)
    info = finetune_method(detector, reduced, det_data, masks=True, limit=2)
    assert info["train_stages"][0]["iters"] == 1 and info["train_images"] == 2
    after = _state(detector)
    assert all(torch.equal(before[k], after[k]) for k in before if ".reducer." not in k)


def test_finetune_algm_trains_the_whole_network_under_all(backbone_factory, det_data):
    """ALGM with ``epochs`` (a stage that trains the backbone itself) inside a detector under the
    ``all`` protocol: each weight once in the optimiser, the backbone and the neck both trained."""
    backbone = backbone_factory("vit_tiny_patch16_224", depth=4)
    baseline = build_detector("det", copy.deepcopy(backbone), 3, width="light")
    baseline.init_weights()
    reduced = vitbench.apply(backbone, "algm", epochs=1, batch_size=2, threshold=0.0)
    detector = build_detector("det", reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    before = _state(detector)
    info = finetune_method(detector, reduced, det_data, masks=False, limit=4, settings=DenseFinetune("all"))
    assert info["train_stages"][0]["iters"] == 2
    after = _state(detector)
    for prefix in ("backbone.model.blocks.0.", "neck."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix)), prefix
