"""ImageNet's flat validation layouts (issue 35, item 4): mmpretrain's ``meta/val.txt``, Kaggle's
``LOC_val_solution.csv`` and the devkit's ground truth, each on a small generated folder; every
image gets its synset's index among the 1000 classes, and a run evaluates on it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
from PIL import Image

from vitbench.data.imagenet_val import find_flat_val, imagenet_synsets
from vitbench.errors import DataError
from vitbench.tasks.cls.data import resolve_cls_data
from vitbench.tasks.cls.evaluate import evaluate_cls

SYNSETS = imagenet_synsets()
#: image i's synset: classes 0, 5, 999, 0, 5, 999 (by index among the 1000)
TRUTH = [0, 5, 999] * 2


def _images(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(len(TRUTH)):
        path = folder / f"ILSVRC2012_val_{i + 1:08d}.JPEG"
        Image.fromarray(rng.integers(0, 256, size=(40, 50, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def annotation_layout(root: Path) -> Path:
    paths = _images(root / "val")
    (root / "meta").mkdir()
    (root / "meta" / "val.txt").write_text("".join(f"{p.name} {t}\n" for p, t in zip(paths, TRUTH)))
    return root


def csv_layout(root: Path) -> Path:
    paths = _images(root / "ILSVRC" / "Data" / "CLS-LOC" / "val")
    rows = [f"{p.stem},{SYNSETS[t]} 10 20 30 40 {SYNSETS[t]} 1 2 3 4" for p, t in zip(paths, TRUTH)]
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "\n".join(reversed(rows)) + "\n")
    return root


def devkit_layout(root: Path) -> Path:
    from scipy.io import savemat

    _images(root / "ILSVRC2012_img_val")
    devkit = root / "ILSVRC2012_devkit_t12" / "data"
    devkit.mkdir(parents=True)
    # the devkit numbers the synsets its own way (ILSVRC2012_ID), not in synset order
    ids = {SYNSETS[0]: 449, SYNSETS[5]: 12, SYNSETS[999]: 1}
    synsets = np.array([(i, w) for w, i in ids.items()], dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O")])
    savemat(devkit / "meta.mat", {"synsets": synsets})
    (devkit / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{ids[SYNSETS[t]]}\n" for t in TRUTH))
    return root


LAYOUTS = {"annotation file": annotation_layout, "LOC_val_solution.csv": csv_layout, "devkit": devkit_layout}


@pytest.fixture(scope="module")
def model():
    return timm.create_model("test_vit", pretrained=False, num_classes=1000).eval()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layout_labels_every_image_by_its_synset(layout: str, tmp_path: Path, model) -> None:
    root = LAYOUTS[layout](tmp_path / "imagenet")
    assert find_flat_val(root).layout == layout
    data = resolve_cls_data(str(root), model)
    assert data.num_classes == 1000 and data.classes == SYNSETS and data.bgr
    dataset = data.build()
    labels = sorted((Path(dataset.get_data_info(i)["img_path"]).name, dataset.get_data_info(i)["gt_label"])
                    for i in range(len(dataset)))
    assert [label for _, label in labels] == TRUTH
    assert tuple(dataset[0]["inputs"].shape) == (3, 160, 160)
    out = evaluate_cls(model, data, limit=4, batch_size=2)
    assert out["num_images"] == 4 and 0 <= out["top1_pct"] <= 100


def test_a_model_of_other_classes_is_refused(tmp_path: Path) -> None:
    root = csv_layout(tmp_path / "imagenet")
    small = timm.create_model("test_vit", pretrained=False, num_classes=10)
    with pytest.raises(DataError, match=r"is ImageNet's validation set \(LOC_val_solution.csv\), 1000 classes, "
                                        r"but the model predicts 10"):
        resolve_cls_data(str(root), small)


def test_a_devkit_count_that_does_not_match_is_one_clear_error(tmp_path: Path, model) -> None:
    root = devkit_layout(tmp_path / "imagenet")
    next((root / "ILSVRC2012_img_val").iterdir()).unlink()
    with pytest.raises(DataError, match=r"labels 6 images but .* holds 5"):
        resolve_cls_data(str(root), model).build()


def test_an_image_missing_from_the_csv_is_named(tmp_path: Path, model) -> None:
    root = csv_layout(tmp_path / "imagenet")
    Image.new("RGB", (8, 8)).save(root / "ILSVRC" / "Data" / "CLS-LOC" / "val" / "extra.JPEG")
    with pytest.raises(DataError, match=r"1 images of .* have no row in .*LOC_val_solution.csv \(first: extra.JPEG\)"):
        resolve_cls_data(str(root), model).build()
