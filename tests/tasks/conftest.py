"""Fixtures for the cls task tests: a tiny timm ViT and tiny generated image folders."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer


def tiny_vit(*, num_classes: int = 6, in_chans: int = 3, img_size: int = 32, seed: int = 0) -> VisionTransformer:
    """A 2-block ViT with random weights and a timm-style pretrained_cfg (fast on CPU)."""
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=img_size, patch_size=8, in_chans=in_chans,
                              num_classes=num_classes, embed_dim=32, depth=2, num_heads=2)
    model.pretrained_cfg = {"input_size": (in_chans, img_size, img_size), "crop_pct": 0.875,
                            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
                            "std": (0.229, 0.224, 0.225)}
    return model.eval()




@pytest.fixture()
def model() -> VisionTransformer:
    return tiny_vit()


@pytest.fixture()
def make_model():
    return tiny_vit




@pytest.fixture()
def image_folder(tmp_path: Path, folder_writer) -> Path:
    """ROOT/val/<6 classes>/ with 4 images each (varied sizes so resize and crop both act)."""
    root = tmp_path / "folder"
    for k, name in enumerate(["ant", "bee", "cat", "dog", "eel", "fox"]):
        folder_writer(root / "val", {name: 4}, size=(40 + 4 * k, 48 - 2 * k), seed=k)
    return root
