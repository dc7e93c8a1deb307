"""The Fashion-MNIST scenes (issue 62, item 2): real garments from the Fashion-MNIST package on
COCO canvases, determinism, masks that decode to their area, boxes that are the masks' extent,
items that stay at least half visible, the cache stamp, and ``--data fmnist-scenes``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from vitbench.data.fashion_mnist import CLASSES
from vitbench.data.fmnist_scenes import ScenesSettings, default_fmnist_scenes, generate_fmnist_scenes, is_complete

SMALL = ScenesSettings(train_images=12, val_images=6)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_fmnist_scenes(tmp_path_factory.mktemp("scenes"), SMALL)


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_item_has_a_mask_its_box_bounds_and_a_garment_class(small_set: Path, split: str) -> None:
    coco = COCO(str(small_set / f"annotations/instances_{split}2017.json"))
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(CLASSES)
    assert len(coco.getImgIds()) == SMALL.images(split)
    per_image = [len(coco.getAnnIds(imgIds=[i])) for i in coco.getImgIds()]
    assert all(1 <= n <= SMALL.max_items for n in per_image) and max(per_image) >= 3  # several items, overlapping
    for ann in coco.loadAnns(coco.getAnnIds()):
        mask = coco.annToMask(ann)
        rows, cols = np.nonzero(mask)
        assert mask.sum() == ann["area"] > 0
        assert ann["bbox"] == [cols.min(), rows.min(), cols.max() + 1 - cols.min(), rows.max() + 1 - rows.min()]
    image = np.asarray(Image.open(small_set / f"{split}2017" / "000000000001.png"))
    assert image.shape == (SMALL.size, SMALL.size) and image.dtype == np.uint8


def test_masks_of_one_image_do_not_overlap_and_the_garments_are_bright(small_set: Path) -> None:
    coco = COCO(str(small_set / "annotations/instances_val2017.json"))
    for image_id in coco.getImgIds():
        masks = [coco.annToMask(a) for a in coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))]
        assert int(np.sum(masks, axis=0).max()) == 1  # each pixel shows one item: the one in front
        pixels = np.asarray(Image.open(small_set / "val2017" / f"{image_id:012d}.png"), dtype=np.float32)
        on = np.sum(masks, axis=0).astype(bool)
        assert pixels[on].mean() > pixels[~on].mean() + 40  # garments over a dark background


def test_the_same_settings_give_the_same_bytes(small_set: Path, tmp_path: Path) -> None:
    again = generate_fmnist_scenes(tmp_path / "again", SMALL)
    for name in ("annotations/instances_train2017.json", "annotations/instances_val2017.json",
                 "val2017/000000000003.png"):
        assert (again / name).read_bytes() == (small_set / name).read_bytes()
    other = generate_fmnist_scenes(tmp_path / "other", SMALL, seed=1)
    assert (other / "val2017/000000000003.png").read_bytes() != (small_set / "val2017/000000000003.png").read_bytes()


def test_the_cache_is_made_once_and_remade_for_other_settings(tmp_path: Path) -> None:
    root = default_fmnist_scenes(tmp_path, SMALL)
    stamp = json.loads((root / "stamp.json").read_text())
    assert stamp["settings_hash"] == SMALL.digest() and is_complete(root, SMALL) and not is_complete(root)
    before = (root / "stamp.json").stat().st_mtime_ns
    assert default_fmnist_scenes(tmp_path, SMALL) == root and (root / "stamp.json").stat().st_mtime_ns == before
    default_fmnist_scenes(tmp_path, SMALL, val_images=2)
    assert len(list((root / "val2017").iterdir())) == 2


@pytest.mark.parametrize("bad", [{"min_items": 0}, {"min_items": 5, "max_items": 3}, {"max_scale": 8.0},
                                 {"val_images": 0}])
def test_impossible_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ScenesSettings(**bad)


def test_data_fmnist_scenes_resolves_to_the_generated_set(small_set: Path, monkeypatch) -> None:
    from vitbench.tasks.dense import data

    monkeypatch.setattr(data, "default_fmnist_scenes", lambda cache: small_set)  # the default is 3,500 images
    resolved = data.resolve_det_data("fmnist-scenes")
    assert resolved.name == "fmnist-scenes" and resolved.embedded and resolved.classes == CLASSES
    assert data.resolve_det_data(None).name == "fmnist-scenes"  # the dense tasks' default data
