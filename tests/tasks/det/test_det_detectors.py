"""The det (SSDLite) and seg (Mask R-CNN + FPN) detectors: configs, building around the backbone
without copying it, the SSDHead quirk, the tensor forward, init_weights, and loading the trained
baseline detector into one around a reduced backbone."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import vitbench
from vitbench.errors import UnknownNameError, VitbenchError
from vitbench.mm.compat import ssd_head_predict_fix
from vitbench.tasks.dense.backbone import FeatureMaps
from vitbench.tasks.dense.detectors import build_detector, dense_task
from vitbench.tasks.det.ssdlite import ssdlite_cfg
from vitbench.tasks.seg.mask_rcnn import mask_rcnn_cfg
from vitbench.tasks.dense.run import DetectorForward, load_detector_weights


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_ssdlite_config_widths():
    full = ssdlite_cfg((80, 384), 3)
    light = ssdlite_cfg((80, 384), 3, width="light")
    assert full["neck"]["out_channels"] == (80, 384, 512, 256, 256, 128)
    assert light["neck"]["out_channels"] == (80, 384, 128, 64, 64, 32)
    assert light["bbox_head"]["in_channels"] == light["neck"]["out_channels"]
    assert full["bbox_head"]["num_classes"] == 3 and full["neck"]["in_channels"] == (80, 384)
    anchors = full["bbox_head"]["anchor_generator"]
    assert len(anchors["strides"]) == len(anchors["min_sizes"]) == len(anchors["max_sizes"]) == 6
    assert full["data_preprocessor"]["pad_size_divisor"] == 1 and full["data_preprocessor"]["bgr_to_rgb"]


def test_mask_rcnn_config_widths():
    full = mask_rcnn_cfg([32, 64, 128, 256], 5)
    light = mask_rcnn_cfg([32, 64, 128, 256], 5, width="light")
    assert full["neck"]["out_channels"] == 256 and light["neck"]["out_channels"] == 64
    assert full["roi_head"]["bbox_head"]["fc_out_channels"] == 1024
    assert light["roi_head"]["bbox_head"]["fc_out_channels"] == 256
    assert full["test_cfg"]["rpn"]["max_per_img"] == 1000 and light["test_cfg"]["rpn"]["max_per_img"] == 300
    assert light["train_cfg"]["rcnn"]["sampler"]["num"] == 128
    assert full["roi_head"]["bbox_head"]["num_classes"] == full["roi_head"]["mask_head"]["num_classes"] == 5
    assert full["data_preprocessor"]["pad_size_divisor"] == 32 and full["data_preprocessor"]["pad_mask"]


@pytest.mark.parametrize("task, kind", [("det", "SingleStageDetector"), ("seg", "MaskRCNN")])
def test_build_wraps_the_backbone_without_copying_it(backbone_factory, task, kind):
    backbone = backbone_factory("mobilevit_xs")
    detector = build_detector(task, backbone, 3, width="light")
    assert type(detector).__name__ == kind
    assert isinstance(detector.backbone, FeatureMaps) and detector.backbone.model is backbone
    assert detector.backbone.strides == dense_task(task).strides
    channels = detector.backbone.out_channels
    assert channels == ([80, 384] if task == "det" else [48, 64, 80, 384])
    if task == "det":
        assert len(detector.neck.extra_layers) == 4  # SSD levels at strides 64..320
        assert detector.bbox_head.num_classes == 3
    else:
        assert [c.conv.in_channels for c in detector.neck.lateral_convs] == channels
        assert detector.roi_head.bbox_head.num_classes == 3 and detector.roi_head.mask_head.num_classes == 3


def test_build_around_a_plain_vit_uses_the_pyramid(backbone_factory):
    backbone = backbone_factory("vit_tiny_patch16_224", depth=2)
    detector = build_detector("seg", backbone, 3, width="light")
    assert detector.backbone.model is backbone and detector.backbone.pyramid is not None
    assert [c.conv.in_channels for c in detector.neck.lateral_convs] == [192] * 4


def test_ssd_head_has_loss_cls_none_after_build(backbone_factory):
    from mmdet.models.dense_heads import SSDHead

    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    head = detector.bbox_head
    assert isinstance(head, SSDHead) and "loss_cls" in head.__dict__ and head.loss_cls is None
    ssd_head_predict_fix(detector)  # idempotent
    assert head.loss_cls is None
    del head.loss_cls
    head.loss_cls = nn.Identity()  # a head that owns a loss_cls module keeps it
    ssd_head_predict_fix(detector)
    assert isinstance(head.loss_cls, nn.Identity)


@pytest.mark.parametrize("task, valid", [("cls", "det, seg"), ("detection", "det, seg")])
def test_unknown_task_lists_the_valid_ones(backbone_factory, task, valid):
    with pytest.raises(UnknownNameError, match=f"unknown task '{task}'; valid tasks: {valid}"):
        build_detector(task, backbone_factory("mobilevit_xs"), 3)


def test_unknown_width_lists_the_valid_ones(backbone_factory):
    with pytest.raises(UnknownNameError,
                       match="unknown detector width 'huge'; valid detector widths: full, light"):
        build_detector("det", backbone_factory("mobilevit_xs"), 3, width="huge")


@pytest.mark.parametrize("task", ["det", "seg"])
@pytest.mark.parametrize("name", ["mobilevit_xs", "vit_tiny_patch16_224"])
def test_init_weights_initialises_the_heads_and_keeps_the_backbone(backbone_factory, task, name):
    kwargs = {"depth": 2} if name.startswith("vit_") else {}
    backbone = backbone_factory(name, **kwargs)
    reference = _state(backbone)
    detector = build_detector(task, backbone, 3, width="light")
    heads_before = {k: v for k, v in _state(detector).items() if not k.startswith("backbone.")}
    detector.init_weights()  # what Runner.train() does
    after = _state(backbone)
    assert all(torch.equal(reference[k], after[k]) for k in reference)
    heads_after = _state(detector)
    assert any(not torch.equal(v, heads_after[k]) for k, v in heads_before.items())  # init_cfg applied


@pytest.mark.parametrize("task", ["det", "seg"])
def test_detector_forward_on_a_batch(backbone_factory, task):
    detector = build_detector(task, backbone_factory("mobilevit_xs"), 3, width="light").eval()
    forward = DetectorForward(detector)
    with torch.no_grad():
        out = forward(torch.randn(2, 3, 64, 64))
    tensors = [t for t in _flatten(out) if isinstance(t, torch.Tensor)]
    assert tensors and all(torch.isfinite(t).all() for t in tensors)
    if task == "det":
        cls_scores, bbox_preds = out
        assert len(cls_scores) == len(bbox_preds) == 6  # 2 backbone levels + 4 extra SSD levels
        assert cls_scores[0].shape[0] == 2 and tuple(cls_scores[0].shape[-2:]) == (4, 4)  # stride 16 at 64
    else:
        ((cls_score, bbox_pred, mask_pred),) = out  # the RoI head's outputs on the RPN's proposals
        assert cls_score.shape[1] == 3 + 1 and bbox_pred.shape[1] == 4 * 3
        assert cls_score.shape[0] == bbox_pred.shape[0] > 0 and tuple(mask_pred.shape[1:]) == (3, 28, 28)


def _flatten(out):
    if isinstance(out, (list, tuple)):
        for item in out:
            yield from _flatten(item)
    else:
        yield out


@pytest.fixture()
def baseline_weights(backbone_factory):
    """The state dict of a det detector (light) around the unreduced MobileViT-XS."""
    backbone = backbone_factory("mobilevit_xs")
    detector = build_detector("det", copy.deepcopy(backbone), 3, width="light")
    detector.init_weights()
    with torch.no_grad():  # make every weight distinct from a fresh build
        for p in detector.parameters():
            p.add_(0.01)
    return backbone, _state(detector)


@pytest.mark.parametrize("method, params", [("ltm", {"ratio": 0.5}), ("dcs", {}), ("tome", {"r": 2})])
def test_reduced_detector_loads_the_baseline_weights(baseline_weights, method, params):
    backbone, weights = baseline_weights
    reduced = vitbench.apply(copy.deepcopy(backbone), method, **params)
    detector = build_detector("det", reduced, 3, width="light")
    own = set(detector.state_dict())
    load_detector_weights(detector, weights)
    state = detector.state_dict()
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    assert all(".reducer." in k for k in own - set(weights))  # only the method's own entries were not loaded
    if method != "tome":
        assert own - set(weights)


def test_wrong_weights_are_a_clear_error(baseline_weights):
    backbone, weights = baseline_weights
    detector = build_detector("det", copy.deepcopy(backbone), 3, width="light")
    dropped = dict(weights)
    key = next(k for k in dropped if k.startswith("bbox_head."))
    del dropped[key]
    with pytest.raises(VitbenchError, match=f"does not fit the reduced one: missing \\['{key}'\\]"):
        load_detector_weights(detector, dropped)
    with pytest.raises(VitbenchError, match="unexpected \\['extra.weight'\\]"):
        load_detector_weights(detector, {**weights, "extra.weight": torch.zeros(1)})
    seg = build_detector("seg", copy.deepcopy(backbone), 3, width="light")
    with pytest.raises(VitbenchError, match="does not fit"):
        load_detector_weights(seg, {k: v for k, v in weights.items() if k.startswith("backbone.")})
