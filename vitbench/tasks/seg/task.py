"""The ``seg`` task: Mask R-CNN instance segmentation on the reduced backbone (shared code:
:mod:`vitbench.tasks.dense`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitbench.catalog import ReportColumn
from vitbench.tasks.dense.task import BOX_MAP, MAP_ABOUT, DenseTask, dense_info

#: what the reports show beside box mAP: COCO mask mAP with AP50 and AP75
MASK_MAP = ReportColumn("mask_map", "Mask mAP", "ΔMask mAP", ".3f", plot_label="mask mAP",
                        after=(("Mask AP50", "mask_ap50"), ("Mask AP75", "mask_ap75")), about=MAP_ABOUT)

__all__ = ["MASK_MAP", "SegTask"]


class SegTask(DenseTask):
    """``seg``: mmdet Mask R-CNN with FPN on the reduced backbone; box and mask mAP."""

    name = "seg"
    info = dense_info("instance segmentation (mmdet Mask R-CNN + FPN): box and mask mAP", (BOX_MAP, MASK_MAP))
    strides = (4, 8, 16, 32)

    def detector_config(self, in_channels: Sequence[int], num_classes: int, *, width: str,
                        mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
        """Mask R-CNN + FPN (:func:`~vitbench.tasks.seg.mask_rcnn.mask_rcnn_cfg`)."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.seg.mask_rcnn import mask_rcnn_cfg

        return mask_rcnn_cfg(in_channels, num_classes, width=width, mean=mean, std=std)
