"""The input a timm model expects: channels, size, eval resize ratio and normalisation, read from
its ``pretrained_cfg`` and its modules; what the data pipelines and the data preprocessor follow."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn

from vitbench.errors import ParamError

__all__ = ["InputConfig", "input_config"]


@dataclass(frozen=True)
class InputConfig:
    """What a model expects as input: channels, size, eval resize ratio and normalisation.

    ``mean``/``std`` are in timm's 0-1 scale with one value per input channel;
    ``crop_pct`` is timm's eval ratio (resize the short side to ``size / crop_pct``, then
    centre-crop ``size``).
    """

    in_chans: int
    input_size: tuple[int, int]
    crop_pct: float
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _in_chans(model: nn.Module) -> int:
    """Input channels: the first convolution's (the patch embedding or stem of timm models)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            return int(module.in_channels)
    return 3


def _per_channel(values: tuple[float, ...], in_chans: int) -> tuple[float, ...]:
    """Fit RGB stats to a grey model (their mean) or grey stats to an RGB model (repeated).

    Without this a 3-value mean broadcasts a 1-channel batch to 3 channels without an error.
    """
    if len(values) == in_chans:
        return values
    if in_chans == 1:
        return (sum(values) / len(values),)
    if len(values) == 1:
        return values * in_chans
    raise ParamError(f"model has {in_chans} input channels but its mean/std have {len(values)} values")


def input_config(model: nn.Module) -> InputConfig:
    """The model's :class:`InputConfig`, from its timm ``pretrained_cfg`` and its modules.

    The image size comes from the patch embedding when there is one, because a timm model
    built with another ``img_size`` keeps its original ``pretrained_cfg``.
    """
    cfg: Mapping = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    in_chans = _in_chans(model)
    size = tuple(cfg.get("input_size", (in_chans, 224, 224))[-2:])
    patch_embed = getattr(model, "patch_embed", None)
    img_size = getattr(patch_embed, "img_size", None)
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    interpolation = cfg.get("interpolation") or "bicubic"
    if interpolation not in ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"):
        interpolation = "bicubic"  # timm's "random" etc. only mean something in training
    return InputConfig(
        in_chans=in_chans,
        input_size=(int(size[0]), int(size[1])),
        crop_pct=float(cfg.get("crop_pct") or 0.875),
        interpolation=interpolation,
        mean=_per_channel(tuple(float(v) for v in cfg.get("mean", IMAGENET_DEFAULT_MEAN)), in_chans),
        std=_per_channel(tuple(float(v) for v in cfg.get("std", IMAGENET_DEFAULT_STD)), in_chans),
    )
