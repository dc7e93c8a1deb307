"""Cropr inside a detector as the paper runs it on dense tasks: each patch's class from the boxes
(the smallest box holding its centre), handed to the method while it fine-tunes on a plain ViT;
``cropr.aux=patches`` with last-layer fusion trains one query per patch in det and seg."""
from __future__ import annotations

import copy

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.structures import InstanceData

import vitbench
import vitbench.tasks.dense.train as dense_train
from vitbench.engine import reduction_context
from vitbench.tasks.dense.detectors import build_detector
from vitbench.tasks.dense.protocol import DETECTOR_PREFIX, DenseFinetune, stage_for
from vitbench.tasks.dense.run import load_detector_weights
from vitbench.tasks.dense.train import DetStages, finetune_method, patch_labels


def _sample(boxes, labels) -> DetDataSample:
    sample = DetDataSample()
    gt = InstanceData()
    gt.bboxes = HorizontalBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
    gt.labels = torch.tensor(labels, dtype=torch.long)
    sample.gt_instances = gt
    return sample


def test_each_patch_takes_the_class_of_the_smallest_box_holding_its_centre():
    """A 3x3 grid of 10-pixel patches (centres at 5, 15, 25): a large box of class 0 over the
    top-left 2x2 patches, a small one of class 2 over the centre patch; background 3 elsewhere."""
    samples = [_sample([[0, 0, 20, 20], [12, 12, 18, 18]], [0, 2]), _sample([], [])]
    labels = patch_labels(samples, (3, 3), 10, background=3)
    assert labels.dtype == torch.long and labels.shape == (2, 9)
    assert labels[0].reshape(3, 3).tolist() == [[0, 0, 3], [0, 2, 3], [3, 3, 3]]
    assert labels[1].tolist() == [3] * 9


@pytest.mark.parametrize("task, protocol", [("det", "all"), ("seg", "method")])
def test_cropr_with_patch_heads_fine_tunes_inside_a_detector(backbone_factory, det_data, task, protocol,
                                                             monkeypatch):
    """Under ``all`` the backbone Cropr trains itself is one of the detector's weights (at the
    control's rate), not a second time in the method's group."""
    backbone = backbone_factory("vit_tiny_patch16_224", depth=4)  # 64 px: a 4x4 grid
    baseline = build_detector(task, copy.deepcopy(backbone), 3, width="light")
    baseline.init_weights()
    reduced = vitbench.apply(backbone, "cropr", rate=2, fusion=True, aux="patches", epochs=1, batch_size=2)
    modules = [b.reducer.selection for b in reduced.blocks if hasattr(b.reducer, "selection")]
    assert [m.queries.shape[1] for m in modules] == [16, 16]  # modules before blocks 1 and 2 of 4
    assert all(m.head[1].out_features == 4 for m in modules)  # 3 classes and the background
    detector = build_detector(task, reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    seen = []
    monkeypatch.setattr(dense_train, "patch_labels", lambda *a, **k: seen.append(patch_labels(*a, **k)) or seen[-1])
    before = {k: v.detach().clone() for k, v in detector.state_dict().items()}
    info = finetune_method(detector, reduced, det_data, masks=task == "seg", limit=4,
                           settings=DenseFinetune(protocol))
    stage = info["train_stages"][0]
    assert stage["iters"] == 2 and torch.isfinite(torch.tensor(stage["last_extra"]))
    assert [tuple(labels.shape) for labels in seen] == [(2, 16), (2, 16)]
    assert all(((labels >= 0) & (labels <= 3)).all() for labels in seen)
    assert any(not torch.equal(before[k], v) for k, v in detector.state_dict().items() if k.endswith("queries"))
    assert reduction_context(reduced).patch_labels is None  # only while a batch trains
    assert any(not torch.equal(before[k], v) for k, v in detector.state_dict().items()
               if k.startswith("backbone.model.blocks.0."))  # the whole network fine-tuned
    neck_moved = any(not torch.equal(before[k], v) for k, v in detector.state_dict().items()
                      if k.startswith("neck."))
    assert neck_moved == (protocol == "all")


def test_under_all_the_backbone_a_stage_trains_is_a_detector_weight(backbone_factory, det_data):
    """Each parameter once; the backbone's under the detector's name (so at the detector's rate,
    the first lr group, as the control's), the selection modules under the method's."""
    reduced = vitbench.apply(backbone_factory("vit_tiny_patch16_224", depth=4), "cropr", rate=2, batch_size=2)
    detector = build_detector("det", reduced, 3, width="light")
    settings = DenseFinetune("all")
    source = DetStages("cropr", detector, reduced, det_data, masks=False, settings=settings, limit=4,
                       precision="fp32", batches=None)
    stage = stage_for(reduction_context(reduced).reduction.train[0], settings, last=True)
    params = source.parameters(stage)
    assert len({id(p) for p in params.values()}) == len(params)
    assert {id(p) for p in params.values()} == {id(p) for p in detector.parameters()}
    backbone = [n for n in params if "blocks.0.block.attn" in n]
    assert backbone and all(n.startswith(DETECTOR_PREFIX) for n in backbone)
    assert stage.lr_groups[0] == (DETECTOR_PREFIX, settings.detector_lr)
    assert all(not n.startswith(DETECTOR_PREFIX) for n in params if "selection" in n)
