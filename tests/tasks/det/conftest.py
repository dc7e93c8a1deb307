"""Fixtures of the det/seg task tests: a tiny generated shapes COCO set (64 px, 4+4 images) and
small random-init backbones sized as :func:`vitbench.tasks.dense.run.load_backbone` sizes them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import timm
import torch

from vitbench.data.shapes_coco import generate_shapes_coco
from vitbench.tasks.dense.data import DetData, resolve_det_data

#: the image size of the tiny set and of the detectors built on it (the generator's minimum)
SIZE = 64


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A COCO root with 4 train and 4 val 64x64 images (read-only: copy it to change it)."""
    return generate_shapes_coco(tmp_path_factory.mktemp("shapes"), train_images=4, val_images=4, size=SIZE)


@pytest.fixture(scope="session")
def det_data(shapes_root: Path) -> DetData:
    """The tiny set as the det/seg tasks see it, at the detectors' input size 64."""
    return dataclasses.replace(resolve_det_data(str(shapes_root)), input_size=SIZE)


def make_backbone(name: str = "mobilevit_xs", *, size: int = SIZE, num_classes: int = 3, seed: int = 0,
                  **kwargs) -> torch.nn.Module:
    """A random-init timm model in eval mode with ``vitbench_input_size`` set (as load_backbone does)."""
    torch.manual_seed(seed)
    if name.startswith(("vit_", "deit")):
        kwargs.setdefault("img_size", size)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    model.vitbench_input_size = (size, size)
    return model.eval()


@pytest.fixture()
def backbone_factory():
    """:func:`make_backbone` as a fixture (conftest modules are not reliably importable)."""
    return make_backbone
