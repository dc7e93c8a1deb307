"""Which COCO-format data the ``det``/``seg`` tasks train and evaluate on.

``--data ROOT`` is a COCO root (``annotations/instances_{train,val}2017.json`` and the
``train2017``/``val2017`` image folders, checked by :func:`vitbench.data.shapes_coco.find_coco`);
without it, the Fashion-MNIST scenes (:func:`~vitbench.data.fmnist_scenes.default_fmnist_scenes`);
``--data shapes-coco`` the generated shapes set (:func:`~vitbench.data.shapes_coco.default_shapes_coco`).
:class:`DetData` holds mmdet ``CocoDataset`` configs and the ``CocoMetric`` config; the data
sets are built inside the runners.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vitbench.data.fmnist_scenes import default_fmnist_scenes
from vitbench.data.shapes_coco import default_shapes_coco, find_coco
from vitbench.errors import DataError
from vitbench.tasks.embedded import DENSE_BACKBONES

#: the name ``--data`` may use for the embedded set (and what ``spec.data`` records)
SHAPES = "shapes-coco"
#: the name of the embedded Fashion-MNIST scenes (real garments, overlapping, 10 classes)
SCENES = "fmnist-scenes"
#: the sets vitbench generates itself, by the name ``--data`` gives them
EMBEDDED_DATA = (SHAPES, SCENES)
#: what the dense tasks run on without ``--data``
DEFAULT_DATA = SCENES
#: the detectors' input size (SSDLite's 320x320, the seeds' setting; Mask R-CNN uses it too)
INPUT_SIZE = 320


@dataclass(frozen=True)
class DetData:
    """A COCO-format data set: paths, class names, and the mm configs built from them."""

    name: str
    root: Path
    train_ann: Path
    train_img: Path
    val_ann: Path
    val_img: Path
    classes: tuple[str, ...] = field(repr=False)
    input_size: int = INPUT_SIZE
    embedded: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def dataset_cfg(self, split: str, *, masks: bool, limit: Optional[int] = None) -> dict[str, Any]:
        """The mmdet ``CocoDataset`` config of ``split`` (``train``/``val``); ``limit``: first N images.

        Training keeps images with objects only and flips at random; both resize to the
        square input (no keep-ratio: SSDLite's setting, and the generated images are square).
        """
        train = split == "train"
        ann, img = (self.train_ann, self.train_img) if train else (self.val_ann, self.val_img)
        load = {"type": "mmdet.LoadAnnotations", "with_bbox": True, "with_mask": masks}
        resize = {"type": "mmdet.Resize", "scale": (self.input_size, self.input_size), "keep_ratio": False}
        if train:
            pipeline = [{"type": "LoadImageFromFile"}, load, resize,
                        {"type": "mmdet.RandomFlip", "prob": 0.5}, {"type": "mmdet.PackDetInputs"}]
        else:
            pipeline = [{"type": "LoadImageFromFile"}, resize, load,
                        {"type": "mmdet.PackDetInputs",
                         "meta_keys": ("img_id", "img_path", "ori_shape", "img_shape", "scale_factor")}]
        cfg: dict[str, Any] = {
            "type": "mmdet.CocoDataset", "data_root": "", "ann_file": str(ann),
            "data_prefix": {"img": str(img) + "/"}, "metainfo": {"classes": self.classes},
            "filter_cfg": {"filter_empty_gt": train, "min_size": 1}, "pipeline": pipeline,
            "test_mode": not train,
        }
        if limit is not None:
            cfg["indices"] = int(limit)
        return copy.deepcopy(cfg)

    def metric_cfg(self, *, masks: bool) -> dict[str, Any]:
        """mmdet's ``CocoMetric`` on the validation annotations (bbox, and segm with masks)."""
        return {"type": "mmdet.CocoMetric", "ann_file": str(self.val_ann),
                "metric": ["bbox", "segm"] if masks else ["bbox"], "format_only": False}


def _classes(ann_file: Path) -> tuple[str, ...]:
    """Category names in id order, read from a COCO annotation file."""
    try:
        with open(ann_file) as f:
            categories = json.load(f).get("categories", [])
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read the COCO annotation file {ann_file}: {exc}") from exc
    if not categories:
        raise DataError(f"COCO annotation file {ann_file} lists no categories")
    return tuple(c["name"] for c in sorted(categories, key=lambda c: c["id"]))


def embedded_backbone(model: str, data: Optional[str], pretrained: bool, checkpoint: Optional[str]) -> Optional[str]:
    """The embedded model whose weights ``model`` starts from (:data:`~vitbench.tasks.embedded.DENSE_BACKBONES`):
    on the embedded data, unless ``--pretrained`` or ``--checkpoint`` names other weights; else ``None``."""
    if pretrained or checkpoint is not None or (data or DEFAULT_DATA) not in EMBEDDED_DATA:
        return None
    return DENSE_BACKBONES.get(model)


def embedded_weights(name: str) -> str:
    """The embedded backbone ``name``'s weights in words, as a run's identity holds them."""
    # torch: the embedded models' module, when its weights are named
    from vitbench.tasks.cls.weights_from import default_model_sha256

    digest = default_model_sha256(name)
    return f"{name} (sha256 {digest[:12]})" if digest else name


def resolve_det_data(data: Optional[str], *, cache: Optional[str] = None) -> DetData:
    """``--data`` for det/seg: ``None``/``"shapes-coco"`` or ``"fmnist-scenes"`` is an embedded
    generated set (made on first use), anything else a COCO root; a missing file raises
    :class:`DataError`."""
    name = DEFAULT_DATA if data is None else data
    embedded = name in EMBEDDED_DATA
    if embedded:
        root = default_shapes_coco(cache) if name == SHAPES else default_fmnist_scenes(cache)
    else:
        root = Path(name).expanduser()
    train_ann, train_img, val_ann, val_img = find_coco(root)
    return DetData(name=name if embedded else str(root), root=root, train_ann=train_ann,
                   train_img=train_img, val_ann=val_ann, val_img=val_img, classes=_classes(val_ann),
                   embedded=embedded)
