"""The cls task's model: an mmpretrain ``ImageClassifier`` around a (reduced) timm model.

The timm model stays whole, head included, so its logits are exactly what a plain timm forward
gives (DeiT's distilled model keeps averaging its two heads). :class:`TimmLogits` returns those
logits as the classifier's single "feature", and mmpretrain's ``ClsHead`` (which has no layers:
its ``pre_logits`` returns the last feature) turns them into the CE loss in training and into
scores for the ``Accuracy`` metric in evaluation.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import timm
import torch
from mmengine.model import BaseModule
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import DefaultScope
from mmpretrain.models import ImageClassifier
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vitbench.errors import ParamError
from vitbench.mm.registry import MODELS

#: ClsDataPreprocessor normalises raw 0-255 pixels; timm's pretrained_cfg stats are in 0-1.
PIXEL_SCALE = 255.0


@MODELS.register_module()
class TimmLogits(BaseModule):
    """Backbone holding a built timm model; ``forward`` returns ``(logits,)``.

    ``model`` is the module itself (the usual case: a possibly reduced model built in Python)
    or a config dict built from the registries (``vitbench.TimmModel`` /
    ``vitbench.TimmVisionTransformer``), so a config file can describe the whole classifier.
    """

    def __init__(self, model: nn.Module | dict, init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg)
        if isinstance(model, dict):
            model = MODELS.build(model)
        if not isinstance(model, nn.Module):
            raise ParamError(f"TimmLogits needs an nn.Module or a config dict, got {type(model).__name__}")
        self.model = model

    def init_weights(self) -> None:
        """Keep the held weights.

        mmengine's ``Runner.train()`` calls ``init_weights()`` on the whole classifier, and
        ``BaseModule.init_weights`` calls every child's ``init_weights`` -- timm's
        ``VisionTransformer.init_weights`` would re-initialise a trained or pretrained backbone
        before fine-tuning. The timm model initialised itself when it was constructed.
        """

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        """The timm model's logits, as the one-element feature tuple mm necks/heads expect; in
        fp32 (under ``--precision bf16``/``fp16`` autocast they come out in half precision, which
        mmpretrain's metrics cannot turn into numpy)."""
        return (self.model(x).float(),)


@MODELS.register_module(name="TimmModel")
def timm_model(model_name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` for config files (``dict(type="vitbench.TimmModel", model_name=...)``)."""
    return timm.create_model(model_name, **kwargs)


@MODELS.register_module(name="TimmVisionTransformer")
def timm_vision_transformer(**kwargs: Any) -> nn.Module:
    """A timm ``VisionTransformer`` from architecture kwargs (the embedded default's config)."""
    return VisionTransformer(**kwargs)


def _check_stats(mean: Sequence[float], std: Sequence[float]) -> None:
    """Reject mean/std that ClsDataPreprocessor would silently broadcast or divide by zero."""
    if len(mean) != len(std) or len(mean) not in (1, 3):
        raise ParamError(f"mean {tuple(mean)} and std {tuple(std)} must both have 1 or 3 values")
    if any(s <= 0 for s in std):
        raise ParamError(f"std {tuple(std)} must be positive")
    if any(m > 1.0 for m in mean) or any(s > 1.0 for s in std):
        raise ParamError(f"mean {tuple(mean)} / std {tuple(std)} look like 0-255 values; "
                         "pass them in timm's 0-1 scale (as in model.pretrained_cfg)")


def classifier_cfg(model: nn.Module | dict, *, mean: Sequence[float], std: Sequence[float],
                   to_rgb: bool) -> dict:
    """The ``ImageClassifier`` config dict (shared by :func:`build_classifier` and the configs).

    ``mean``/``std`` are in timm's 0-1 scale (as in ``model.pretrained_cfg``); they are scaled
    to mmpretrain's 0-255 here. ``to_rgb`` flips BGR to RGB (mmcv loads images as BGR).
    Every type carries its scope so the dict builds under any current default scope.
    """
    _check_stats(mean, std)
    return {
        "type": "mmpretrain.ImageClassifier",
        "backbone": {"type": "vitbench.TimmLogits", "model": model},
        "head": {"type": "mmpretrain.ClsHead",
                 "loss": {"type": "mmpretrain.CrossEntropyLoss", "loss_weight": 1.0},
                 "topk": (1, 5)},
        "data_preprocessor": {"type": "mmpretrain.ClsDataPreprocessor",
                              "mean": [round(m * PIXEL_SCALE, 6) for m in mean],
                              "std": [round(s * PIXEL_SCALE, 6) for s in std],
                              "to_rgb": to_rgb},
    }


def build_classifier(model: nn.Module, *, mean: Sequence[float], std: Sequence[float],
                     to_rgb: bool) -> ImageClassifier:
    """Wrap ``model`` (not copied) in an mmpretrain ``ImageClassifier`` that returns its logits.

    ``mean``/``std``: the model's input normalisation in timm's 0-1 scale, one value per input
    channel (``vitbench.data.input_config.input_config(model)`` reads them from
    ``model.pretrained_cfg``). ``to_rgb``: True when the data arrive as BGR (mmcv's image
    loading) and the model expects RGB.
    """
    cfg = classifier_cfg(model, mean=mean, std=std, to_rgb=to_rgb)
    # mmpretrain builds sub-modules by unscoped names too; pin its scope for the build.
    with DefaultScope.overwrite_default_scope("mmpretrain"):
        classifier = MMENGINE_MODELS.build(cfg)
    assert isinstance(classifier, ImageClassifier)
    return classifier
