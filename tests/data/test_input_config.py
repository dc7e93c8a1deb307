"""The input a timm model expects: channels, size, crop ratio, interpolation, per-channel stats."""
from __future__ import annotations

import pytest
import timm
from timm.models.vision_transformer import VisionTransformer

from vitbench.data.input_config import input_config


def _grey_vit() -> VisionTransformer:
    model = VisionTransformer(img_size=32, patch_size=8, in_chans=1, num_classes=6, embed_dim=32, depth=2,
                              num_heads=2)
    model.pretrained_cfg = {"input_size": (1, 32, 32), "crop_pct": 0.875, "interpolation": "bicubic",
                            "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    return model


def test_input_config() -> None:
    cfg = input_config(_grey_vit())
    assert cfg.in_chans == 1 and cfg.input_size == (32, 32)
    assert cfg.mean == pytest.approx(((0.485 + 0.456 + 0.406) / 3,))
    deit = timm.create_model("deit_tiny_patch16_224")
    cfg = input_config(deit)
    assert cfg.input_size == (224, 224) and cfg.crop_pct == deit.pretrained_cfg["crop_pct"] == 0.9 and cfg.interpolation == "bicubic"
    assert cfg.mean == pytest.approx((0.485, 0.456, 0.406))
