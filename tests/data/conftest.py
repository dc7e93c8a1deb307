"""Fixtures for the data tests: tiny generated image folders (PIL PNGs in tmp_path)."""
from __future__ import annotations

from pathlib import Path

import pytest






@pytest.fixture()
def image_folder(tmp_path: Path, folder_writer) -> Path:
    """ImageNet layout: ROOT/val/{a,b,c}/img*.png (2, 3, 1 images) and ROOT/train/{a,b,c}."""
    folder_writer(tmp_path / "imgs" / "val", {"a": 2, "b": 3, "c": 1})
    folder_writer(tmp_path / "imgs" / "train", {"a": 1, "b": 1, "c": 1}, seed=1)
    return tmp_path / "imgs"
