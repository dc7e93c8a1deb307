"""Fixtures of the measurement tests: a tiny timm ViT (fast) and the reference backbones."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer


def make_tiny_vit() -> VisionTransformer:
    """A 2-block ViT on 32x32 inputs: runs in milliseconds on a CPU."""
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, num_classes=10)


@pytest.fixture
def tiny_vit() -> VisionTransformer:
    return make_tiny_vit()


@pytest.fixture
def tiny_vit_factory() -> Callable[[], VisionTransformer]:
    return make_tiny_vit


@pytest.fixture(scope="session")
def deit_s() -> torch.nn.Module:
    return timm.create_model("deit_small_patch16_224", pretrained=False)


@pytest.fixture(scope="session")
def vit_b() -> torch.nn.Module:
    return timm.create_model("vit_base_patch16_224", pretrained=False)
