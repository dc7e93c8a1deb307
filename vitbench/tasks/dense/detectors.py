"""A dense task's mmdet detector around :class:`FeatureMaps`: the task names the strides it takes
from the backbone and writes the detector's config (``det``: SSDLite, :mod:`vitbench.tasks.det.ssdlite`;
``seg``: Mask R-CNN, :mod:`vitbench.tasks.seg.mask_rcnn`).

``width`` scales the detector's own layers: ``"full"`` is the published layout (FPN 256
channels, 1024-wide box FCs, 1000 test proposals); ``"light"`` (64 channels, 256-wide FCs,
300 proposals, 128 sampled RoIs) is what the embedded default uses so that a CPU trains it in
minutes. The backbone is never changed by ``width``.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from torch import nn

from vitbench.errors import choices_error
from vitbench.host import get_host
from vitbench.tasks.dense.backbone import out_channels_of
from vitbench.mm.compat import ssd_head_predict_fix

WIDTHS = ("full", "light")
#: ImageNet mean/std in 0..255 RGB, as timm's and mmdet's configs use
MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def preprocessor(masks: bool, mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
    return {"type": "mmdet.DetDataPreprocessor", "mean": list(mean), "std": list(std), "bgr_to_rgb": True,
            "pad_size_divisor": 32 if masks else 1, "pad_mask": masks}


class DetectorTask(Protocol):
    """What a dense task tells this module (:class:`~vitbench.tasks.dense.task.DenseTask` has both)."""

    strides: tuple[int, ...]

    def detector_config(self, in_channels: Sequence[int], num_classes: int, *, width: str,
                        mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]: ...


def build_detector(task: str, backbone: nn.Module, num_classes: int, *, width: str = "full",
                   mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> nn.Module:
    """The dense ``task``'s mmdet detector (:meth:`DenseTask.detector_config`) on the (reduced) timm
    model ``backbone``."""
    from mmdet.registry import MODELS as MMDET_MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import ConfigDict
    from mmengine.registry import DefaultScope

    dense = dense_task(task)
    if width not in WIDTHS:
        raise choices_error("detector width", width, WIDTHS)
    register_all_modules(init_default_scope=False)
    cfg = dense.detector_config(out_channels_of(backbone, dense.strides), num_classes, width=width, mean=mean, std=std)
    # mmdet reads its train/test settings as attributes: they must be ConfigDicts
    cfg = ConfigDict(cfg)
    cfg["backbone"] = {"type": "vitbench.FeatureMaps", "model": backbone, "strides": dense.strides}
    # mmdet builds its inner parts (assigners, IoU calculators) by unscoped names, resolved in the
    # *current* default scope, which an earlier cls runner may have left at mmpretrain
    with DefaultScope.overwrite_default_scope("mmdet"):
        detector = MMDET_MODELS.build(cfg)
    if detector.backbone.model is not backbone:
        raise RuntimeError("the detector config copied the backbone instead of wrapping it")
    # init_cfg (neck and heads) is applied by Runner.train(); FeatureMaps keeps the timm weights
    ssd_head_predict_fix(detector)
    return detector


def dense_task(name: str) -> DetectorTask:
    """The registered dense task ``name``: one that names its detector's strides (a
    :class:`~vitbench.tasks.dense.task.DenseTask`)."""
    dense = {task: spec for task, spec in get_host().specs("tasks").items() if getattr(spec, "strides", ())}
    if name not in dense:
        raise choices_error("task", name, tuple(sorted(dense)))
    return dense[name]
