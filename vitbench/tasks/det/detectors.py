"""The two detectors of the dense tasks, as mmdet model configs around :class:`FeatureMaps`.

- ``det``: mmdet ``SingleStageDetector`` with ``SSDNeck`` and the SSDLite head (depthwise
  ``SSDHead``), anchors of mmdet's SSDLite-320 config (strides 16..320, min sizes 48..304),
  smooth-L1 + CE with 3:1 hard negative mining (MobileViT paper Sec. 4.2 and mmdet's
  ``ssdlite_mobilenetv2-scratch_8xb24-600e_coco``): the backbone gives strides 16 and 32, the
  neck adds four extra levels.
- ``seg``: mmdet ``MaskRCNN`` with ``FPN`` (strides 4..32, five outputs), RPN, RoIAlign box
  and mask heads (mmdet's ``mask-rcnn_r50_fpn``).

``width`` scales the detector's own layers: ``"full"`` is the published layout (FPN 256
channels, 1024-wide box FCs, 1000 test proposals); ``"light"`` (64 channels, 256-wide FCs,
300 proposals, 128 sampled RoIs) is what the embedded default uses so that a CPU trains it in
minutes. The backbone is never changed by ``width``.
"""
from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from vitbench.errors import choices_error
from vitbench.tasks.det.backbone import out_channels_of

#: what each task's detector takes from the backbone
STRIDES = {"det": (16, 32), "seg": (4, 8, 16, 32)}
WIDTHS = ("full", "light")
#: ImageNet mean/std in 0..255 RGB, as timm's and mmdet's configs use
MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def _preprocessor(masks: bool, mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
    return {"type": "mmdet.DetDataPreprocessor", "mean": list(mean), "std": list(std), "bgr_to_rgb": True,
            "pad_size_divisor": 32 if masks else 1, "pad_mask": masks}


def ssdlite_cfg(in_channels: Sequence[int], num_classes: int, *, width: str = "full",
                mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> dict[str, Any]:
    """The SSDLite-320 detector config (backbone filled in by :func:`build_detector`)."""
    extra = (512, 256, 256, 128) if width == "full" else (128, 64, 64, 32)
    channels = (*in_channels, *extra)
    bn = {"type": "BN", "eps": 0.001, "momentum": 0.03}
    return {
        "type": "mmdet.SingleStageDetector",
        "data_preprocessor": _preprocessor(False, mean, std),
        "neck": {"type": "mmdet.SSDNeck", "in_channels": tuple(in_channels), "out_channels": channels,
                 "level_strides": (2, 2, 2, 2), "level_paddings": (1, 1, 1, 1), "l2_norm_scale": None,
                 "use_depthwise": True, "norm_cfg": bn, "act_cfg": {"type": "ReLU6"},
                 "init_cfg": {"type": "TruncNormal", "layer": "Conv2d", "std": 0.03}},
        "bbox_head": {
            "type": "mmdet.SSDHead", "in_channels": channels, "num_classes": num_classes,
            "use_depthwise": True, "norm_cfg": bn, "act_cfg": {"type": "ReLU6"},
            "init_cfg": {"type": "Normal", "layer": "Conv2d", "std": 0.001},
            "anchor_generator": {"type": "mmdet.SSDAnchorGenerator", "scale_major": False,
                                 "strides": [16, 32, 64, 107, 160, 320], "ratios": [[2, 3]] * 6,
                                 "min_sizes": [48, 100, 150, 202, 253, 304],
                                 "max_sizes": [100, 150, 202, 253, 304, 320]},
            "bbox_coder": {"type": "mmdet.DeltaXYWHBBoxCoder", "target_means": [0.0] * 4,
                           "target_stds": [0.1, 0.1, 0.2, 0.2]}},
        "train_cfg": {"assigner": {"type": "mmdet.MaxIoUAssigner", "pos_iou_thr": 0.5, "neg_iou_thr": 0.5,
                                   "min_pos_iou": 0.0, "ignore_iof_thr": -1, "gt_max_assign_all": False},
                      "sampler": {"type": "mmdet.PseudoSampler"}, "smoothl1_beta": 1.0, "allowed_border": -1,
                      "pos_weight": -1, "neg_pos_ratio": 3, "debug": False},
        "test_cfg": {"nms_pre": 1000, "nms": {"type": "nms", "iou_threshold": 0.45}, "min_bbox_size": 0,
                     "score_thr": 0.02, "max_per_img": 200},
    }


def mask_rcnn_cfg(in_channels: Sequence[int], num_classes: int, *, width: str = "full",
                  mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> dict[str, Any]:
    """The Mask R-CNN + FPN detector config (backbone filled in by :func:`build_detector`)."""
    full = width == "full"
    c, fc = (256, 1024) if full else (64, 256)
    proposals = 1000 if full else 300
    rois = 512 if full else 128
    ce = {"type": "mmdet.CrossEntropyLoss"}
    assigner = {"type": "mmdet.MaxIoUAssigner", "ignore_iof_thr": -1, "match_low_quality": True}
    return {
        "type": "mmdet.MaskRCNN",
        "data_preprocessor": _preprocessor(True, mean, std),
        "neck": {"type": "mmdet.FPN", "in_channels": list(in_channels), "out_channels": c, "num_outs": 5},
        "rpn_head": {
            "type": "mmdet.RPNHead", "in_channels": c, "feat_channels": c,
            "anchor_generator": {"type": "mmdet.AnchorGenerator", "scales": [8], "ratios": [0.5, 1.0, 2.0],
                                 "strides": [4, 8, 16, 32, 64]},
            "bbox_coder": {"type": "mmdet.DeltaXYWHBBoxCoder", "target_means": [0.0] * 4, "target_stds": [1.0] * 4},
            "loss_cls": {**ce, "use_sigmoid": True, "loss_weight": 1.0},
            "loss_bbox": {"type": "mmdet.L1Loss", "loss_weight": 1.0}},
        "roi_head": {
            "type": "mmdet.StandardRoIHead",
            "bbox_roi_extractor": {"type": "mmdet.SingleRoIExtractor", "out_channels": c,
                                   "roi_layer": {"type": "RoIAlign", "output_size": 7, "sampling_ratio": 0},
                                   "featmap_strides": [4, 8, 16, 32]},
            "bbox_head": {"type": "mmdet.Shared2FCBBoxHead", "in_channels": c, "fc_out_channels": fc,
                          "roi_feat_size": 7, "num_classes": num_classes, "reg_class_agnostic": False,
                          "bbox_coder": {"type": "mmdet.DeltaXYWHBBoxCoder", "target_means": [0.0] * 4,
                                         "target_stds": [0.1, 0.1, 0.2, 0.2]},
                          "loss_cls": {**ce, "use_sigmoid": False, "loss_weight": 1.0},
                          "loss_bbox": {"type": "mmdet.L1Loss", "loss_weight": 1.0}},
            "mask_roi_extractor": {"type": "mmdet.SingleRoIExtractor", "out_channels": c,
                                   "roi_layer": {"type": "RoIAlign", "output_size": 14, "sampling_ratio": 0},
                                   "featmap_strides": [4, 8, 16, 32]},
            "mask_head": {"type": "mmdet.FCNMaskHead", "num_convs": 4, "in_channels": c,
                          "conv_out_channels": c, "num_classes": num_classes,
                          "loss_mask": {**ce, "use_mask": True, "loss_weight": 1.0}}},
        "train_cfg": {
            "rpn": {"assigner": {**assigner, "pos_iou_thr": 0.7, "neg_iou_thr": 0.3, "min_pos_iou": 0.3},
                    "sampler": {"type": "mmdet.RandomSampler", "num": 256, "pos_fraction": 0.5, "neg_pos_ub": -1,
                                "add_gt_as_proposals": False},
                    "allowed_border": -1, "pos_weight": -1, "debug": False},
            "rpn_proposal": {"nms_pre": 2 * proposals, "max_per_img": proposals,
                             "nms": {"type": "nms", "iou_threshold": 0.7}, "min_bbox_size": 0},
            "rcnn": {"assigner": {**assigner, "pos_iou_thr": 0.5, "neg_iou_thr": 0.5, "min_pos_iou": 0.5},
                     "sampler": {"type": "mmdet.RandomSampler", "num": rois, "pos_fraction": 0.25, "neg_pos_ub": -1,
                                 "add_gt_as_proposals": True},
                     "mask_size": 28, "pos_weight": -1, "debug": False}},
        "test_cfg": {
            "rpn": {"nms_pre": proposals, "max_per_img": proposals, "nms": {"type": "nms", "iou_threshold": 0.7},
                    "min_bbox_size": 0},
            "rcnn": {"score_thr": 0.05, "nms": {"type": "nms", "iou_threshold": 0.5}, "max_per_img": 100,
                     "mask_thr_binary": 0.5}},
    }


def build_detector(task: str, backbone: nn.Module, num_classes: int, *, width: str = "full",
                   mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> nn.Module:
    """The ``task``'s mmdet detector on the (reduced) timm model ``backbone``."""
    from mmdet.registry import MODELS as MMDET_MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import ConfigDict
    from mmengine.registry import DefaultScope

    from vitbench.mm.compat import ssd_head_predict_fix

    if task not in STRIDES:
        raise choices_error("task", task, tuple(STRIDES))
    if width not in WIDTHS:
        raise choices_error("detector width", width, WIDTHS)
    register_all_modules(init_default_scope=False)
    make = ssdlite_cfg if task == "det" else mask_rcnn_cfg
    cfg = make(out_channels_of(backbone, STRIDES[task]), num_classes, width=width, mean=mean, std=std)
    # mmdet reads its train/test settings as attributes: they must be ConfigDicts
    cfg = ConfigDict(cfg)
    cfg["backbone"] = {"type": "vitbench.FeatureMaps", "model": backbone, "strides": STRIDES[task]}
    # mmdet builds its inner parts (assigners, IoU calculators) by unscoped names, resolved in the
    # *current* default scope, which an earlier cls runner may have left at mmpretrain
    with DefaultScope.overwrite_default_scope("mmdet"):
        detector = MMDET_MODELS.build(cfg)
    if detector.backbone.model is not backbone:
        raise RuntimeError("the detector config copied the backbone instead of wrapping it")
    # init_cfg (neck and heads) is applied by Runner.train(); FeatureMaps keeps the timm weights
    ssd_head_predict_fix(detector)
    return detector
