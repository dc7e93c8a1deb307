"""The backbone wrapper of the ``det``/``seg`` detectors: multi-scale maps from a (reduced) timm
model (docs/architecture.md, "Tasks").

Hybrids and Swin: the maps come from the model's own stages, taken by forward hooks on the very
``forward_features`` a method patched; a map a method shrank (LTM's grid merge) is resized
(bilinear) back to its nominal stride, so the backbone keeps its savings and the detector its
anchors. Plain ViT/DeiT: the tokens are unmerged to the full grid
(:func:`vitbench.engine.unmerge.unmerge`) and a simple feature pyramid (ViTDet, Li et al., ECCV
2022, Sec. 3) makes strides 4, 8 and 32 from the stride-16 map. The pyramid trains with the
detector; the timm weights are never re-initialised."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.engine.block import reduction_context
from vitbench.errors import UnsupportedError
from vitbench.mm.registry import MODELS
from vitbench.engine.unmerge import unmerge

__all__ = ["FeatureMaps", "SimplePyramid", "out_channels_of", "is_plain_vit"]

#: the stride of a plain ViT's token map the pyramid starts from
VIT_STRIDE = 16


def is_plain_vit(model: nn.Module) -> bool:
    """A timm ``VisionTransformer`` (one token map, no stages)."""
    from timm.models.vision_transformer import VisionTransformer

    return isinstance(model, VisionTransformer)


def _stage_modules(model: nn.Module, strides: Sequence[int]) -> list[tuple[str, int]]:
    """``(module name, channels)`` of the last feature module at each stride (timm ``feature_info``)."""
    info = getattr(model, "feature_info", None)
    if not info:
        raise UnsupportedError(f"{type(model).__name__} has no feature_info: the det/seg backbone wrapper "
                               f"supports timm models with stages (MobileViT, EfficientViT, Swin) and plain ViT/DeiT")
    by_stride: dict[int, tuple[str, int]] = {}
    for entry in info:
        by_stride[int(entry["reduction"])] = (str(entry["module"]), int(entry["num_chs"]))
    missing = [s for s in strides if s not in by_stride]
    if missing:
        raise UnsupportedError(f"{type(model).__name__} has no feature map at stride(s) {missing}; "
                               f"it has: {sorted(by_stride)}")
    return [by_stride[s] for s in strides]


def out_channels_of(model: nn.Module, strides: Sequence[int]) -> list[int]:
    """The channels of each map :class:`FeatureMaps` yields for ``model`` at ``strides``."""
    if is_plain_vit(model):
        return [int(model.embed_dim)] * len(strides)
    return [c for _, c in _stage_modules(model, strides)]


class SimplePyramid(nn.Module):
    """ViTDet's simple feature pyramid (Sec. 3): one stride-16 map to the requested strides.

    Stride 4: two 2x2 transposed convolutions (GELU and BatchNorm between); 8: one; 16: the map;
    32: 2x2 max-pool. Channels stay the ViT's width; the detector's neck (FPN / SSD neck) maps
    them to its own.
    """

    def __init__(self, dim: int, strides: Sequence[int]) -> None:
        super().__init__()
        self.strides = tuple(strides)
        levels = []
        for stride in self.strides:
            if stride == 16:
                levels.append(nn.Identity())
            elif stride == 32:
                levels.append(nn.MaxPool2d(2))
            elif stride == 8:
                levels.append(nn.ConvTranspose2d(dim, dim, 2, stride=2))
            elif stride == 4:
                levels.append(nn.Sequential(nn.ConvTranspose2d(dim, dim, 2, stride=2), nn.BatchNorm2d(dim),
                                            nn.GELU(), nn.ConvTranspose2d(dim, dim, 2, stride=2)))
            else:
                raise UnsupportedError(f"the simple feature pyramid makes strides 4, 8, 16, 32; got {stride}")
        self.levels = nn.ModuleList(levels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(level(x) for level in self.levels)


class _Capture:
    """A forward hook storing one module's output under a key (an object: survives deepcopy)."""

    def __init__(self, store: dict[str, torch.Tensor], key: str) -> None:
        self.store, self.key = store, key

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:  # type: ignore[type-arg]
        self.store[self.key] = output


@MODELS.register_module()
class FeatureMaps(nn.Module):
    """mm backbone: ``forward(images) -> tuple of [B, C_i, H/s_i, W/s_i]`` for ``strides``.

    ``model`` is the (reduced) timm model; ``strides`` the output strides the detector wants
    (SSDLite ``(16, 32)``, Mask R-CNN FPN ``(4, 8, 16, 32)``).
    """

    def __init__(self, model: nn.Module, strides: Sequence[int] = (16, 32)) -> None:
        super().__init__()
        self.model = model
        self.strides = tuple(int(s) for s in strides)
        self.pyramid: Optional[SimplePyramid] = None
        self._maps: dict[str, torch.Tensor] = {}
        #: the last forward's maps that a method made smaller: ``{stride: (their size, the nominal)}``
        self.resized: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
        self._channels_last = getattr(model, "output_fmt", "NCHW") == "NHWC"
        if is_plain_vit(model):
            self.pyramid = SimplePyramid(int(model.embed_dim), self.strides)
            context = reduction_context(model)
            if context is not None:
                context.trace_source = True  # unmerge needs the sources
            self._names: list[str] = []
        else:
            self._names = [name for name, _ in _stage_modules(model, self.strides)]
            for name in dict.fromkeys(self._names):
                model.get_submodule(name).register_forward_hook(_Capture(self._maps, name))
        self.out_channels = out_channels_of(model, self.strides)

    def init_weights(self) -> None:
        """Keep the timm weights (mmengine's ``init_weights`` would reset a timm ViT)."""

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        context = reduction_context(self.model)
        if context is not None:  # what the model's forward pre-hook does; forward_features skips it
            context.inputs = images  # (the IB terms of LTM/DCS read the current input images)
        if self.pyramid is not None:
            return self.pyramid(self._vit_map(images))
        self._maps.clear()
        self.model.forward_features(images)
        h, w = images.shape[-2:]
        out, self.resized = [], {}
        for name, stride in zip(self._names, self.strides):
            fmap = self._maps[name]
            if self._channels_last:  # Swin's stages give [B, H, W, C]
                fmap = fmap.permute(0, 3, 1, 2)
            size = (math.ceil(h / stride), math.ceil(w / stride))
            if tuple(fmap.shape[-2:]) != size:  # a method merged to a smaller grid (LTM)
                self.resized[stride] = (tuple(fmap.shape[-2:]), size)
                fmap = F.interpolate(fmap, size=size, mode="bilinear", align_corners=False)
            out.append(fmap)
        self._maps.clear()
        return tuple(out)

    def _vit_map(self, images: torch.Tensor) -> torch.Tensor:
        """The stride-16 patch-token map ``[B, C, H/16, W/16]``, unmerged when reduced."""
        model = self.model
        tokens = model.forward_features(images)
        context = reduction_context(model)
        if context is not None and context.state is not None and context.state.source is not None:
            tokens = unmerge(tokens, context.state)
        patches = tokens[:, model.num_prefix_tokens:]
        gh, gw = model.patch_embed.dynamic_feat_size(images.shape[-2:]) \
            if getattr(model, "dynamic_img_size", False) else model.patch_embed.grid_size
        b, n, c = patches.shape
        if n != gh * gw:
            raise UnsupportedError(f"{n} patch tokens do not fill the {gh}x{gw} grid (a method that drops "
                                   f"tokens without source tracing cannot feed a dense task)")
        return patches.transpose(1, 2).reshape(b, c, gh, gw)
