"""The generated shapes COCO set: determinism, COCO validity, boxes vs masks, cache stamp, errors."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from vitbench.data import shapes_coco
from vitbench.data.shapes_coco import (
    SHAPES,
    STAMP_FILE,
    ShapesSettings,
    default_shapes_coco,
    find_coco,
    generate_shapes_coco,
)
from vitbench.errors import DataError

SMALL = ShapesSettings(train_images=24, val_images=8)
SPLITS = ("train", "val")


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_shapes_coco(tmp_path_factory.mktemp("shapes"), SMALL)


@pytest.fixture(scope="module")
def cocos(small_set: Path) -> dict[str, COCO]:
    return {split: COCO(str(small_set / f"annotations/instances_{split}2017.json")) for split in SPLITS}


def _mask_box(mask: np.ndarray) -> np.ndarray:
    """``[x0, y0, x1, y1]`` of a binary mask's pixels (x1, y1 exclusive, like a COCO box's end)."""
    rows, cols = np.nonzero(mask)
    return np.array([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=float)


def test_same_seed_same_bytes(small_set: Path, tmp_path: Path) -> None:
    again = generate_shapes_coco(tmp_path / "again", SMALL)
    for split in SPLITS:
        name = f"annotations/instances_{split}2017.json"
        assert (again / name).read_bytes() == (small_set / name).read_bytes()
    png = "val2017/000000000003.png"
    assert (again / png).read_bytes() == (small_set / png).read_bytes()
    other = generate_shapes_coco(tmp_path / "other", SMALL, seed=1)
    assert (other / "annotations/instances_val2017.json").read_bytes() != \
        (small_set / "annotations/instances_val2017.json").read_bytes()


def test_pycocotools_loads_both_splits(small_set: Path, cocos: dict[str, COCO]) -> None:
    for split, coco in cocos.items():
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(SHAPES)
        assert len(coco.getImgIds()) == SMALL.images(split)
        for cat_id in coco.getCatIds():
            assert len(coco.getAnnIds(catIds=[cat_id])) > 0, (split, cat_id)
        per_image = Counter(a["image_id"] for a in coco.dataset["annotations"])
        assert set(per_image) == set(coco.getImgIds())  # every image has an object
        assert 1 <= min(per_image.values()) and max(per_image.values()) <= SMALL.max_objects
        assert all(a["iscrowd"] == 0 for a in coco.dataset["annotations"])
        for info in coco.loadImgs(coco.getImgIds()[:3]):
            with Image.open(small_set / f"{split}2017" / info["file_name"]) as image:
                assert image.size == (info["width"], info["height"]) and image.mode == "RGB"


def test_boxes_inside_images_and_match_masks(cocos: dict[str, COCO]) -> None:
    sides = []
    for coco in cocos.values():
        for ann in coco.dataset["annotations"]:
            info = coco.imgs[ann["image_id"]]
            x, y, w, h = ann["bbox"]
            assert w > 0 and h > 0 and x >= 0 and y >= 0
            assert x + w <= info["width"] and y + h <= info["height"]
            mask = coco.annToMask(ann)
            assert mask.shape == (info["height"], info["width"])
            assert np.abs(_mask_box(mask) - [x, y, x + w, y + h]).max() <= 1.5, ann["id"]
            assert abs(int(mask.sum()) - ann["area"]) <= w + h, ann["id"]  # half a pixel of edge
            sides.append(max(w, h))
    assert min(sides) <= 40 and max(sides) >= 120  # small objects and SSD-sized ones


def test_images_show_the_annotated_objects(small_set: Path, cocos: dict[str, COCO]) -> None:
    """Inside each mask the colour differs clearly from a thin ring of background around its box."""
    coco = cocos["val"]
    for ann in coco.dataset["annotations"]:
        info = coco.imgs[ann["image_id"]]
        pixels = np.asarray(Image.open(small_set / "val2017" / info["file_name"]), dtype=float)
        x, y, w, h = ann["bbox"]
        x0, y0, x1, y1 = int(np.floor(x)), int(np.floor(y)), int(np.ceil(x + w)), int(np.ceil(y + h))
        ring = np.zeros(pixels.shape[:2], dtype=bool)
        ring[max(y0 - 3, 0):y1 + 4, max(x0 - 3, 0):x1 + 4] = True
        ring[max(y0 - 1, 0):y1 + 2, max(x0 - 1, 0):x1 + 2] = False
        inside = np.median(pixels[coco.annToMask(ann).astype(bool)], axis=0)
        outside = np.median(pixels[ring], axis=0)
        assert np.linalg.norm(inside - outside) > 50, ann["id"]


def test_cache_is_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = ShapesSettings(train_images=3, val_images=2)
    root = default_shapes_coco(tmp_path, tiny)
    assert root == tmp_path / "shapes_coco"
    assert find_coco(root)[0] == root / "annotations/instances_train2017.json"
    assert json.loads((root / STAMP_FILE).read_text())["settings_hash"] == tiny.digest()
    assert [p.name for p in tmp_path.iterdir()] == ["shapes_coco"]  # no temporary folders left

    def must_not_run(*args: object, **kwargs: object) -> Path:
        raise AssertionError("regenerated a complete cache entry")

    monkeypatch.setattr(shapes_coco, "generate_shapes_coco", must_not_run)
    assert default_shapes_coco(tmp_path, tiny) == root


@pytest.mark.parametrize("damage", ["corrupt stamp", "missing stamp", "missing annotations", "other settings"])
def test_cache_regenerates_when_incomplete_or_stale(tmp_path: Path, damage: str) -> None:
    tiny = ShapesSettings(train_images=3, val_images=2)
    root = default_shapes_coco(tmp_path, tiny)
    expected = (root / "annotations/instances_val2017.json").read_bytes()
    wanted = tiny
    if damage == "corrupt stamp":
        (root / STAMP_FILE).write_text('{"settings_ha')
    elif damage == "missing stamp":
        (root / STAMP_FILE).unlink()
    elif damage == "missing annotations":
        (root / "annotations/instances_val2017.json").unlink()
    else:
        wanted = ShapesSettings(train_images=3, val_images=2, seed=1)
    assert default_shapes_coco(tmp_path, wanted) == root
    assert shapes_coco.is_complete(root, wanted)
    assert json.loads((root / STAMP_FILE).read_text())["settings_hash"] == wanted.digest()
    new = (root / "annotations/instances_val2017.json").read_bytes()
    assert (new == expected) == (wanted == tiny)
    assert [p.name for p in tmp_path.iterdir()] == ["shapes_coco"]


def test_interrupted_generation_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(root: Path, settings: ShapesSettings) -> Path:
        (Path(root) / "annotations").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(shapes_coco, "generate_shapes_coco", crash)
    with pytest.raises(KeyboardInterrupt):
        default_shapes_coco(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_cache_folder_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    assert default_shapes_coco(train_images=2, val_images=1) == tmp_path / "cache" / "shapes_coco"


def test_find_coco_names_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nowhere does not exist; expected ROOT/annotations/instances_train2017.json"):
        find_coco(tmp_path / "nowhere")


def test_find_coco_names_every_missing_path(tmp_path: Path) -> None:
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations/instances_train2017.json").write_text("{}")
    (tmp_path / "train2017").mkdir()
    with pytest.raises(DataError) as err:
        find_coco(tmp_path)
    message = str(err.value)
    assert f"lacks {tmp_path}/annotations/instances_val2017.json, {tmp_path}/val2017/;" in message
    assert "train2017.json," not in message.split("expected")[0]  # present paths are not listed
    assert "expected ROOT/annotations/instances_train2017.json, ROOT/annotations/instances_val2017.json, " \
           "ROOT/train2017/ and ROOT/val2017/" in message


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="classes must be distinct names among circle, square, triangle"):
        ShapesSettings(classes=("circle", "star"))
    with pytest.raises(ValueError, match="at least 1"):
        ShapesSettings(val_images=0)
