"""Fixtures for the data tests: tiny generated image folders (PIL PNGs in tmp_path)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def write_folder(root: Path, classes: dict[str, int], *, size: tuple[int, int] = (40, 48),
                 seed: int = 0) -> Path:
    """Write ``count`` random RGB PNGs per class under ``root/<class>/``; returns ``root``."""
    rng = np.random.default_rng(seed)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"img{i}.png")
    return root


@pytest.fixture()
def folder_writer():
    """The :func:`write_folder` helper (a fixture: conftest modules are not importable reliably)."""
    return write_folder


@pytest.fixture()
def image_folder(tmp_path: Path) -> Path:
    """ImageNet layout: ROOT/val/{a,b,c}/img*.png (2, 3, 1 images) and ROOT/train/{a,b,c}."""
    write_folder(tmp_path / "imgs" / "val", {"a": 2, "b": 3, "c": 1})
    write_folder(tmp_path / "imgs" / "train", {"a": 1, "b": 1, "c": 1}, seed=1)
    return tmp_path / "imgs"
