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


def _val_txt(root: Path) -> Path:
    return root / "meta" / "val.txt"


def _rewrite(path: Path, edit) -> None:
    path.write_bytes(edit(path.read_bytes()))


ANNOTATION_FAULTS = {  # what is done to meta/val.txt -> what the one line says
    "label 1500": (lambda b: b.replace(b" 999\n", b" 1500\n", 1), r"val.txt:3: label 1500 is outside ImageNet's classes 0-999"),
    "label -1": (lambda b: b.replace(b" 0\n", b" -1\n", 1), r"val.txt:1: label -1 is outside"),
    "label text": (lambda b: b.replace(b" 5\n", b" cat\n", 1), r"val.txt:2: label 'cat' is not an integer 0-999"),
    "label float": (lambda b: b.replace(b" 5\n", b" 5.0\n", 1), r"val.txt:2: label '5.0' is not an integer"),
    "no label": (lambda b: b.replace(b" 5\n", b"\n", 1), r"val.txt:2: expected '<image> <label 0-999>'"),
    "duplicate": (lambda b: b + b.splitlines(keepends=True)[0], r"val.txt:7: ILSVRC2012_val_00000001.JPEG is listed again \(first on line 1\)"),
    "half unlisted": (lambda b: b"".join(b.splitlines(keepends=True)[:3]), r"3 images of .*val are not in .*val.txt \(first: ILSVRC2012_val_00000004.JPEG\)"),
    "empty": (lambda b: b"", r"val.txt lists no images"),
    "not UTF-8": (lambda b: b.replace(b"00000002", b"0000\xff002", 1), r"val.txt:2: not UTF-8 text \(byte 0xff\)"),
    "outside": (lambda b: b.replace(b"ILSVRC2012_val_00000001.JPEG", b"../../../../etc/passwd", 1), r"val.txt:1: image '../../../../etc/passwd' is outside"),
    "absolute": (lambda b: b.replace(b"ILSVRC2012_val_00000001.JPEG", b"/etc/passwd", 1), r"val.txt:1: image '/etc/passwd' is outside"),
    "missing image": (lambda b: b.replace(b"00000001.JPEG", b"00000009.JPEG", 1), r"val.txt:1: image 'ILSVRC2012_val_00000009.JPEG' is not in"),
}


def test_a_pipe_listed_as_an_image_is_refused_not_read(tmp_path: Path, model) -> None:
    import os

    root = annotation_layout(tmp_path / "imagenet")
    os.mkfifo(root / "val" / "pipe.JPEG")
    _rewrite(_val_txt(root), lambda b: b + b"pipe.JPEG 3\n")
    with pytest.raises(DataError, match=r"val.txt:7: 'pipe.JPEG' is a FIFO \(named pipe\), not an image"):
        resolve_cls_data(str(root), model).build()


def _csv(root: Path) -> Path:
    return root / "LOC_val_solution.csv"


CSV_FAULTS = {
    "conflicting rows": (lambda b: b + b"ILSVRC2012_val_00000001," + SYNSETS[7].encode() + b" 1 2 3 4\n",
                         r"LOC_val_solution.csv:8: image 'ILSVRC2012_val_00000001' has a second row \(first on line \d\)"),
    "empty prediction": (lambda b: b.replace(SYNSETS[5].encode() + b" 10 20 30 40 " + SYNSETS[5].encode() + b" 1 2 3 4", b"", 1),
                         r"LOC_val_solution.csv:\d: image 'ILSVRC2012_val_0000000\d' has no prediction string"),
    "huge field": (lambda b: b + b"x," + b"n" * 200_000 + b"\n", r"LOC_val_solution.csv:8: not a CSV row \(field larger than field limit"),
    "not UTF-8": (lambda b: b.replace(b"ImageId,", b"Image\xe9d,", 1), r"LOC_val_solution.csv:1: not UTF-8 text"),
    "unknown synset": (lambda b: b.replace(SYNSETS[5].encode(), b"n99999999"), r"synset 'n99999999' is not one of the 1000 ImageNet classes"),
}


#: layout -> (how to make it, its label file, its faults)
FAULTY = {"annotation file": (annotation_layout, _val_txt, ANNOTATION_FAULTS),
          "LOC_val_solution.csv": (csv_layout, _csv, CSV_FAULTS)}


@pytest.mark.parametrize("layout, fault", [(layout, fault) for layout, (_, _, faults) in FAULTY.items()
                                           for fault in faults])
def test_a_faulty_label_file_is_one_error_naming_its_line(layout: str, fault: str, tmp_path: Path, model) -> None:
    make, label_file, faults = FAULTY[layout]
    root = make(tmp_path / "imagenet")
    edit, said = faults[fault]
    _rewrite(label_file(root), edit)
    with pytest.raises(DataError, match=said):
        resolve_cls_data(str(root), model).build()


def test_a_png_beside_the_jpeg_of_one_image_id_is_refused(tmp_path: Path, model) -> None:
    root = csv_layout(tmp_path / "imagenet")
    Image.new("RGB", (8, 8)).save(root / "ILSVRC" / "Data" / "CLS-LOC" / "val" / "ILSVRC2012_val_00000001.png")
    with pytest.raises(DataError, match=r"ILSVRC2012_val_00000001.JPEG and ILSVRC2012_val_00000001.png in .* are one "
                                        r"ImageId"):
        resolve_cls_data(str(root), model).build()


def _truth(root: Path) -> Path:
    return root / "ILSVRC2012_devkit_t12" / "data" / "ILSVRC2012_validation_ground_truth.txt"


@pytest.mark.parametrize("text, said", [
    ("449\n12\nx\n449\n12\n1\n", r"ground_truth.txt:3: 'x' is not an ILSVRC2012_ID of meta.mat \(1-449\)"),
    ("449\n12\n1\n449\n12\n0\n", r"ground_truth.txt:6: '0' is not an ILSVRC2012_ID"),
    ("449\n12\n1\n449\n12\n1001\n", r"ground_truth.txt:6: '1001' is not an ILSVRC2012_ID"),
    ("449\n12\n1.5\n449\n12\n1\n", r"ground_truth.txt:3: '1.5' is not an ILSVRC2012_ID"),
])
def test_a_faulty_devkit_id_is_one_error_naming_its_line(text: str, said: str, tmp_path: Path, model) -> None:
    root = devkit_layout(tmp_path / "imagenet")
    _truth(root).write_text(text)
    with pytest.raises(DataError, match=said):
        resolve_cls_data(str(root), model).build()


@pytest.mark.parametrize("content", [b"not a mat file at all", b"\x89HDF\r\n\x1a\n" + bytes(600)])
def test_a_corrupt_or_hdf5_meta_mat_is_one_error(content: bytes, tmp_path: Path, model) -> None:
    root = devkit_layout(tmp_path / "imagenet")
    (root / "ILSVRC2012_devkit_t12" / "data" / "meta.mat").write_bytes(content)
    with pytest.raises(DataError, match=r"meta.mat is not the devkit's meta.mat \(a MATLAB v5 file"):
        resolve_cls_data(str(root), model).build()


def numbered_layout(root: Path, truth=(0, 1, 2, 0, 1, 2)) -> Path:
    """``meta/val.txt`` of a set of one's own 3 classes, labels 0..2."""
    paths = _images(root / "val")
    (root / "meta").mkdir()
    (root / "meta" / "val.txt").write_text("".join(f"{p.name} {t}\n" for p, t in zip(paths, truth)))
    return root


def test_an_annotation_file_read_by_a_model_of_fewer_classes_is_a_set_of_that_many(tmp_path: Path) -> None:
    root = numbered_layout(tmp_path / "mine")
    three = timm.create_model("test_vit", pretrained=False, num_classes=3).eval()
    data = resolve_cls_data(str(root), three)
    assert data.num_classes == 3 and data.classes == ("0", "1", "2")
    assert data.layout == "flat folder, meta/val.txt, labels 0-2"
    dataset = data.build()
    assert sorted(dataset.get_data_info(i)["gt_label"] for i in range(len(dataset))) == [0, 0, 1, 1, 2, 2]
    assert evaluate_cls(three, data, batch_size=3)["num_classes"] == 3


def test_the_same_file_read_by_a_1000_way_model_is_imagenet_labels(tmp_path: Path, model) -> None:
    data = resolve_cls_data(str(numbered_layout(tmp_path / "mine")), model)
    assert data.num_classes == 1000 and data.layout == "flat folder, meta/val.txt, ImageNet labels"


def test_a_label_outside_the_models_classes_is_one_line(tmp_path: Path) -> None:
    root = numbered_layout(tmp_path / "mine", truth=(0, 1, 2, 0, 1, 3))
    three = timm.create_model("test_vit", pretrained=False, num_classes=3)
    with pytest.raises(DataError, match=r"val.txt:6: label 3 is outside the 3 classes 0-2"):
        resolve_cls_data(str(root), three).build()


def _train_folders(root: Path, classes: int) -> None:
    rng = np.random.default_rng(1)
    for c in range(classes):
        (root / "train" / f"class{c}").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(root / "train" / f"class{c}" / f"{i}.png")


def test_its_training_split_is_meta_train_txt_or_as_many_sorted_class_folders(tmp_path: Path) -> None:
    three = timm.create_model("test_vit", pretrained=False, num_classes=3)
    root = numbered_layout(tmp_path / "folders")
    _train_folders(root, 3)
    assert resolve_cls_data(str(root), three).train_cfg()["type"] == "vitbench.ClsImageFolder"
    listed = numbered_layout(tmp_path / "listed")
    (listed / "train").mkdir()
    names = []
    for i, label in enumerate((2, 1, 0)):
        Image.new("RGB", (40, 50)).save(listed / "train" / f"t{i}.png")
        names.append(f"t{i}.png {label}\n")
    (listed / "meta" / "train.txt").write_text("".join(names))
    cfg = resolve_cls_data(str(listed), three).train_cfg()
    assert cfg["type"] == "vitbench.ImageNetVal" and cfg["split"] == "train" and cfg["num_classes"] == 3
    from mmengine.registry import DATASETS, DefaultScope

    with DefaultScope.overwrite_default_scope("mmpretrain"):
        train = DATASETS.build(cfg)
    assert sorted(train.get_data_info(i)["gt_label"] for i in range(len(train))) == [0, 1, 2]
    wrong = numbered_layout(tmp_path / "wrong")
    _train_folders(wrong, 2)
    with pytest.raises(DataError, match=r"has 2 class folders but the evaluation labels \(meta/val.txt\) name 3"):
        resolve_cls_data(str(wrong), three).train_cfg()
