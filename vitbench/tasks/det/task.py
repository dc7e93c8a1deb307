"""The ``det`` task: SSDLite detection on the reduced backbone (shared code: :mod:`vitbench.tasks.dense`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitbench.tasks.dense.task import BOX_MAP, DenseTask, dense_info

__all__ = ["DetTask"]


class DetTask(DenseTask):
    """``det``: mmdet SSDLite on the reduced backbone; box mAP, AP50, AP75."""

    name = "det"
    info = dense_info("object detection (mmdet SSDLite on the backbone): box mAP, AP50, AP75", (BOX_MAP,))
    strides = (16, 32)

    def detector_config(self, in_channels: Sequence[int], num_classes: int, *, width: str,
                        mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
        """SSDLite-320 (:func:`~vitbench.tasks.det.ssdlite.ssdlite_cfg`)."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.det.ssdlite import ssdlite_cfg

        return ssdlite_cfg(in_channels, num_classes, width=width, mean=mean, std=std)
