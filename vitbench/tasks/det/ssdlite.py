"""``det``'s detector: mmdet ``SingleStageDetector`` with ``SSDNeck`` and the SSDLite head
(depthwise ``SSDHead``), anchors of mmdet's SSDLite-320 config (strides 16..320, min sizes
48..304), smooth-L1 + CE with 3:1 hard negative mining (MobileViT paper Sec. 4.2 and mmdet's
``ssdlite_mobilenetv2-scratch_8xb24-600e_coco``): the backbone gives strides 16 and 32, the
neck adds four extra levels."""
from __future__ import annotations

from typing import Any, Sequence

from vitbench.tasks.dense.detectors import MEAN, STD, preprocessor

__all__ = ["ssdlite_cfg"]


def ssdlite_cfg(in_channels: Sequence[int], num_classes: int, *, width: str = "full",
                mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> dict[str, Any]:
    """The SSDLite-320 detector config (backbone filled in by :func:`~vitbench.tasks.dense.detectors.build_detector`)."""
    extra = (512, 256, 256, 128) if width == "full" else (128, 64, 64, 32)
    channels = (*in_channels, *extra)
    bn = {"type": "BN", "eps": 0.001, "momentum": 0.03}
    return {
        "type": "mmdet.SingleStageDetector",
        "data_preprocessor": preprocessor(False, mean, std),
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
