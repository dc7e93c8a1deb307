"""DetData and resolve_det_data: the mmdet dataset/metric configs, the embedded default vs a COCO
root, class names in id order, and clear DataErrors for missing or broken annotation files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vitbench.errors import DataError
from vitbench.tasks.dense import data as det_data_module
from vitbench.tasks.dense.data import INPUT_SIZE, SHAPES, DetData, resolve_det_data

CLASSES = ("circle", "square", "triangle")


def _copy(root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(root, tmp_path / "coco"))


def _build(cfg: dict):
    """The mmdet dataset of a ``dataset_cfg`` (the pipeline names mmdet transforms)."""
    import vitbench.mm  # noqa: F401 - its OpenMMLab compat fixes first, as every vitbench mm path has them
    from mmdet.registry import DATASETS
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope

    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope("mmdet"):
        return DATASETS.build(cfg)


def test_resolve_a_coco_root(shapes_root):
    data = resolve_det_data(str(shapes_root))
    assert data.name == str(shapes_root) and data.root == shapes_root and not data.embedded
    assert data.classes == CLASSES and data.num_classes == 3 and data.input_size == INPUT_SIZE
    assert data.train_ann == shapes_root / "annotations/instances_train2017.json"
    assert data.val_ann == shapes_root / "annotations/instances_val2017.json"
    assert data.train_img == shapes_root / "train2017" and data.val_img == shapes_root / "val2017"


def test_shapes_coco_is_the_generated_shapes_set(shapes_root, monkeypatch):
    calls = []

    def fake_default(cache=None):
        calls.append(cache)
        return shapes_root

    monkeypatch.setattr(det_data_module, "default_shapes_coco", fake_default)
    data = resolve_det_data(SHAPES, cache="/somewhere")
    assert calls == ["/somewhere"]
    assert data.embedded and data.name == SHAPES and data.root == shapes_root and data.classes == CLASSES


def test_missing_root_is_a_data_error_naming_it(tmp_path):
    missing = tmp_path / "no_coco_here"
    with pytest.raises(DataError, match=f"COCO data folder {missing} does not exist"):
        resolve_det_data(str(missing))


def test_incomplete_root_names_what_is_missing(shapes_root, tmp_path):
    root = _copy(shapes_root, tmp_path)
    (root / "annotations/instances_val2017.json").unlink()
    shutil.rmtree(root / "train2017")
    with pytest.raises(DataError) as err:
        resolve_det_data(str(root))
    message = str(err.value)
    assert str(root / "annotations/instances_val2017.json") in message and f"{root / 'train2017'}/" in message
    assert "instances_train2017.json," not in message.split("lacks")[1].split("expected")[0]  # present: not listed


def test_class_names_are_read_in_id_order(shapes_root, tmp_path):
    root = _copy(shapes_root, tmp_path)
    ann = root / "annotations/instances_val2017.json"
    coco = json.loads(ann.read_text())
    coco["categories"] = [{"id": 7, "name": "zebra"}, {"id": 2, "name": "bus"}, {"id": 5, "name": "apple"}]
    ann.write_text(json.dumps(coco))
    assert resolve_det_data(str(root)).classes == ("bus", "apple", "zebra")


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read the COCO annotation file"),
    (json.dumps({"images": [], "annotations": []}), "lists no categories"),
    (json.dumps({"images": [], "annotations": [], "categories": []}), "lists no categories"),
])
def test_broken_annotation_file_is_a_data_error(shapes_root, tmp_path, content, message):
    root = _copy(shapes_root, tmp_path)
    ann = root / "annotations/instances_val2017.json"
    ann.write_text(content)
    with pytest.raises(DataError, match=message) as err:
        resolve_det_data(str(root))
    assert str(ann) in str(err.value)


def test_train_config(det_data):
    cfg = det_data.dataset_cfg("train", masks=True, limit=3)
    assert cfg["type"] == "mmdet.CocoDataset" and cfg["ann_file"] == str(det_data.train_ann)
    assert cfg["data_prefix"] == {"img": f"{det_data.train_img}/"}
    assert cfg["metainfo"]["classes"] == CLASSES
    assert cfg["filter_cfg"]["filter_empty_gt"] is True and cfg["test_mode"] is False
    assert cfg["indices"] == 3
    types = [step["type"] for step in cfg["pipeline"]]
    assert types == ["LoadImageFromFile", "mmdet.LoadAnnotations", "mmdet.Resize", "mmdet.RandomFlip",
                     "mmdet.PackDetInputs"]
    load = cfg["pipeline"][1]
    assert load["with_bbox"] is True and load["with_mask"] is True
    assert cfg["pipeline"][2]["scale"] == (64, 64) and cfg["pipeline"][2]["keep_ratio"] is False


def test_val_config(det_data):
    cfg = det_data.dataset_cfg("val", masks=False)
    assert cfg["ann_file"] == str(det_data.val_ann) and cfg["data_prefix"] == {"img": f"{det_data.val_img}/"}
    assert "indices" not in cfg
    assert cfg["filter_cfg"]["filter_empty_gt"] is False and cfg["test_mode"] is True
    types = [step["type"] for step in cfg["pipeline"]]
    assert "mmdet.RandomFlip" not in types and types[-1] == "mmdet.PackDetInputs"
    load = next(step for step in cfg["pipeline"] if step["type"] == "mmdet.LoadAnnotations")
    assert load["with_mask"] is False
    assert "scale_factor" in cfg["pipeline"][-1]["meta_keys"]


def test_configs_are_fresh_copies(det_data):
    cfg = det_data.dataset_cfg("train", masks=False)
    cfg["pipeline"].clear()
    cfg["metainfo"]["classes"] = ("x",)
    again = det_data.dataset_cfg("train", masks=False)
    assert len(again["pipeline"]) == 5 and again["metainfo"]["classes"] == CLASSES


def test_metric_config(det_data):
    assert det_data.metric_cfg(masks=False) == {"type": "mmdet.CocoMetric", "ann_file": str(det_data.val_ann),
                                                "metric": ["bbox"], "format_only": False}
    assert det_data.metric_cfg(masks=True)["metric"] == ["bbox", "segm"]


def test_the_configs_build_mmdet_datasets(det_data):
    train = _build(det_data.dataset_cfg("train", masks=True, limit=3))
    assert len(train) == 3 and tuple(train.metainfo["classes"]) == CLASSES
    item = train[0]
    assert tuple(item["inputs"].shape) == (3, 64, 64)
    gt = item["data_samples"].gt_instances
    assert len(gt) >= 1 and len(gt.masks) == len(gt) and int(gt.labels.max()) < 3
    val = _build(det_data.dataset_cfg("val", masks=False))
    assert len(val) == 4
    sample = val[0]["data_samples"]
    assert "masks" not in sample.gt_instances and sample.img_shape == (64, 64)


def test_input_size_is_a_field(det_data):
    assert isinstance(det_data, DetData) and det_data.input_size == 64
    assert det_data.dataset_cfg("val", masks=False)["pipeline"][1]["scale"] == (64, 64)
