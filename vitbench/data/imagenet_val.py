"""ImageNet's validation set as people keep it: 50,000 JPEGs in one flat folder, the labels in a file.

Three layouts are recognised under ``--data ROOT`` (besides ``ROOT/val/<synset>/...``, which
:mod:`vitbench.data.image_folder` reads):

- mmpretrain's annotation file: ``ROOT/meta/val.txt`` (``<file> <label 0-999>`` per line) over
  ``ROOT/val/``, read by mmpretrain's own ``ImageNet`` data set;
- the Kaggle localisation challenge's ``ROOT/LOC_val_solution.csv`` (``ImageId,PredictionString``,
  the first word of the string the synset) over ``ROOT/ILSVRC/Data/CLS-LOC/val/`` or ``ROOT/val/``;
- the ILSVRC 2012 devkit: ``ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt``
  (one ILSVRC2012_ID per image, in file-name order) with its ``meta.mat`` (ID -> synset) over
  ``ROOT/val/`` or ``ROOT/ILSVRC2012_img_val/``.

Labels are indices into the 1000 ImageNet classes in synset order (timm's and mmpretrain's).
"""
from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mmpretrain.datasets import CustomDataset

from vitbench.data.image_folder import IMAGE_EXTENSIONS
from vitbench.errors import DataError
from vitbench.mm.registry import DATASETS

__all__ = ["FlatVal", "ImageNetVal", "find_flat_val", "imagenet_synsets"]

DEVKIT = Path("ILSVRC2012_devkit_t12") / "data"
CSV = "LOC_val_solution.csv"


@dataclass(frozen=True)
class FlatVal:
    """A located flat validation set: its layout, the image folder and the label file."""

    root: Path
    #: ``annotation file``, ``LOC_val_solution.csv`` or ``devkit``
    layout: str
    images: Path
    labels: Path


def imagenet_synsets() -> tuple[str, ...]:
    """The 1000 ImageNet synsets (``nXXXXXXXX``) in label order."""
    from timm.data import ImageNetInfo

    return tuple(ImageNetInfo().label_names())


def _first_dir(*candidates: Path) -> Optional[Path]:
    return next((c for c in candidates if c.is_dir()), None)


def find_flat_val(root: str | Path) -> Optional[FlatVal]:
    """The flat validation layout under ``root``, or None when it has none of them."""
    root = Path(root).expanduser()
    if (root / "meta" / "val.txt").is_file() and (root / "val").is_dir():
        return FlatVal(root, "annotation file", root / "val", root / "meta" / "val.txt")
    if (root / CSV).is_file():
        images = _first_dir(root / "ILSVRC" / "Data" / "CLS-LOC" / "val", root / "val")
        if images is None:
            raise DataError(f"{root / CSV} found but no image folder: expected {root}/ILSVRC/Data/CLS-LOC/val "
                            f"or {root}/val holding the validation JPEGs")
        return FlatVal(root, CSV, images, root / CSV)
    truth = root / DEVKIT / "ILSVRC2012_validation_ground_truth.txt"
    if truth.is_file():
        images = _first_dir(root / "val", root / "ILSVRC2012_img_val")
        if images is None:
            raise DataError(f"{truth} found but no image folder: expected {root}/val or "
                            f"{root}/ILSVRC2012_img_val holding the validation JPEGs")
        return FlatVal(root, "devkit", images, truth)
    return None


def _flat_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def _csv_labels(path: Path) -> dict[str, str]:
    """ImageId -> synset from ``LOC_val_solution.csv``."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"ImageId", "PredictionString"} <= set(rows[0]):
        raise DataError(f"{path} is not LOC_val_solution.csv: expected the columns ImageId,PredictionString")
    return {row["ImageId"]: row["PredictionString"].split()[0] for row in rows}


def _devkit_synsets(devkit: Path) -> dict[int, str]:
    """ILSVRC2012_ID -> synset from the devkit's ``meta.mat``."""
    from scipy.io import loadmat

    meta = devkit / "meta.mat"
    if not meta.is_file():
        raise DataError(f"{meta} is missing: the devkit's ground truth gives ILSVRC2012_IDs, which it maps to synsets")
    synsets = loadmat(meta, squeeze_me=True)["synsets"]
    return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets}


def labelled_images(split: FlatVal) -> list[tuple[Path, str]]:
    """Every validation image of a CSV or devkit layout with its synset, in file-name order."""
    images = _flat_images(split.images)
    if split.layout == CSV:
        labels = _csv_labels(split.labels)
        missing = [p.name for p in images if p.stem not in labels]
        if missing:
            raise DataError(f"{len(missing)} images of {split.images} have no row in {split.labels} "
                            f"(first: {missing[0]})")
        return [(p, labels[p.stem]) for p in images]
    ids = [int(line) for line in split.labels.read_text().split()]
    if len(ids) != len(images):
        raise DataError(f"{split.labels} labels {len(ids)} images but {split.images} holds {len(images)}; the "
                        f"devkit's ground truth is for the whole validation set, in file-name order")
    synsets = _devkit_synsets(split.labels.parent)
    return [(p, synsets[i]) for p, i in zip(images, ids)]


def flat_val_dataset(split: FlatVal, pipeline: Sequence[Any]) -> dict[str, Any]:
    """The mm data-set config of a located flat validation set."""
    if split.layout == "annotation file":  # mmpretrain's own reader of meta/val.txt
        return {"type": "mmpretrain.ImageNet", "data_root": str(split.root), "split": "val",
                "metainfo": {"classes": imagenet_synsets()}, "pipeline": list(pipeline)}
    return {"type": "vitbench.ImageNetVal", "data_root": str(split.root), "pipeline": list(pipeline)}


@DATASETS.register_module()
class ImageNetVal(CustomDataset):
    """A flat validation folder labelled by ``LOC_val_solution.csv`` or the devkit's ground truth,
    as an mmpretrain data set; labels index the 1000 synsets (:func:`imagenet_synsets`)."""

    def __init__(self, data_root: str, pipeline: Sequence[Any] = (), indices: int | Sequence[int] | None = None,
                 **kwargs: Any) -> None:
        split = find_flat_val(data_root)
        if split is None or split.layout == "annotation file":
            raise DataError(f"{data_root} has no {CSV} or devkit ground truth")
        self.split = split
        super().__init__(data_root=data_root, data_prefix=str(split.images), pipeline=pipeline, indices=indices,
                         test_mode=True, metainfo={"classes": imagenet_synsets()}, **kwargs)

    def load_data_list(self) -> list[dict]:
        """One dict per image: its path and its synset's index."""
        index = {w: i for i, w in enumerate(imagenet_synsets())}
        out = []
        for path, wnid in labelled_images(self.split):
            if wnid not in index:
                raise DataError(f"{path.name}: synset {wnid!r} is not one of the 1000 ImageNet classes")
            out.append({"img_path": str(path), "gt_label": index[wnid]})
        return out
