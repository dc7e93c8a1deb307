"""``seg``'s detector: mmdet ``MaskRCNN`` with ``FPN`` (strides 4..32, five outputs), RPN,
RoIAlign box and mask heads (mmdet's ``mask-rcnn_r50_fpn``)."""
from __future__ import annotations

from typing import Any, Sequence

from vitbench.tasks.dense.detectors import MEAN, STD, preprocessor

__all__ = ["mask_rcnn_cfg"]


def mask_rcnn_cfg(in_channels: Sequence[int], num_classes: int, *, width: str = "full",
                  mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> dict[str, Any]:
    """The Mask R-CNN + FPN detector config (backbone filled in by :func:`~vitbench.tasks.dense.detectors.build_detector`)."""
    full = width == "full"
    c, fc = (256, 1024) if full else (64, 256)
    proposals = 1000 if full else 300
    rois = 512 if full else 128
    ce = {"type": "mmdet.CrossEntropyLoss"}
    assigner = {"type": "mmdet.MaxIoUAssigner", "ignore_iof_thr": -1, "match_low_quality": True}
    return {
        "type": "mmdet.MaskRCNN",
        "data_preprocessor": preprocessor(True, mean, std),
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
