"""ImageNet-style image folders for the cls task, through mmpretrain's ``CustomDataset``.

``--data ROOT`` takes ``ROOT/val/<class>/<image>`` (and ``ROOT/train/...`` for fine-tuning) or
``ROOT/<class>/<image>`` as a single evaluation split. Class folders are numbered by sorted
name unless a ``label_map`` is given (ImageNet synsets keep their 1000-class index).
:func:`eval_pipeline` mirrors timm's resize and centre crop. docs/architecture.md, "Tasks".
A class folder without images or an empty image file is refused when the split is located; an
image that does not decode is a :class:`~vitbench.errors.DataError` naming it (:class:`LoadImage`)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mmcv.transforms import BaseTransform
from mmpretrain.datasets import CustomDataset

from vitbench.data.fingerprint import folder_files
from vitbench.data.read_image import MAX_PIXELS, open_image
from vitbench.errors import DataError, choices_error
from vitbench.mm.registry import DATASETS, TRANSFORMS

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif",
                                     ".tiff", ".webp")
SPLITS = ("val", "train")
LAYOUT_HINT = ("expected ROOT/val/<class>/<image> (ImageNet layout) or ROOT/<class>/<image>; "
               f"images: {' '.join(IMAGE_EXTENSIONS)}")


@dataclass(frozen=True)
class FolderSplit:
    """A located split: the folder whose sub-folders are the classes, and what it holds."""

    root: Path
    split_dir: Path
    classes: tuple[str, ...]
    num_images: int


class MissingSplitError(DataError):
    """A data folder without the split asked for (``ROOT/train`` for fine-tuning or a new head)."""


def _class_images(folder: Path) -> list[Path]:
    """The image files under ``folder`` (any depth, links followed, each folder once so that a
    link loop ends; pipes, devices and hidden files left out), in sorted order."""
    return [p for p in folder_files(folder) if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")]


def _image_sizes(folder: Path) -> dict[Path, int]:
    """The image files under ``folder`` (:func:`_class_images`) and their sizes in bytes."""
    sizes = {}
    for path in _class_images(folder):
        try:
            sizes[path] = path.stat().st_size
        except OSError:
            continue  # gone since the scan
    return sizes


def find_split(root: str | Path, split: str = "val") -> FolderSplit:
    """Locate ``split`` under ``root`` and check it has class folders with images.

    Raises :class:`DataError` naming the path when it is missing or malformed.
    """
    if split not in SPLITS:
        raise choices_error("data split", split, SPLITS)
    root = Path(root).expanduser()
    if not root.exists():
        raise DataError(f"data folder {root} not found; {LAYOUT_HINT}")
    if not root.is_dir():
        raise DataError(f"data path {root} is not a folder; {LAYOUT_HINT}")
    if (root / split).is_dir():
        split_dir = root / split
    elif any((root / s).is_dir() for s in SPLITS):
        raise MissingSplitError(f"malformed data folder {root}: it has no {split}/ split; {LAYOUT_HINT}")
    elif split == "val":
        split_dir = root  # ROOT/<class>/<image>: a single evaluation split
    else:
        raise MissingSplitError(f"malformed data folder {root}: it has no {split}/ split; "
                                f"expected ROOT/{split}/<class>/<image>")
    classes = tuple(sorted(d.name for d in split_dir.iterdir()
                           if d.is_dir() and not d.name.startswith(".")))
    if not classes:
        raise DataError(f"malformed data folder {split_dir}: no class folders; {LAYOUT_HINT}")
    images = {c: _image_sizes(split_dir / c) for c in classes}
    num_images = sum(len(found) for found in images.values())
    if num_images == 0:
        raise DataError(f"malformed data folder {split_dir}: {len(classes)} class folders but no "
                        f"images in them; {LAYOUT_HINT}")
    empty = [c for c in classes if not images[c]]
    if empty:  # a class without images: a head fitted or scored without it, silently
        raise DataError(f"malformed data folder {split_dir}: class folder {split_dir / empty[0]} holds no images"
                        f"{f' ({len(empty)} such folders: {_listed(empty)})' if len(empty) > 1 else ''}; "
                        f"remove it or add its images ({' '.join(IMAGE_EXTENSIONS)})")
    blank = sorted(path for found in images.values() for path, size in found.items() if size == 0)
    if blank:
        raise DataError(f"image {blank[0]} is empty (0 bytes)"
                        f"{f'; {len(blank)} such files in {split_dir}' if len(blank) > 1 else ''}; "
                        f"remove or replace it")
    return FolderSplit(root=root, split_dir=split_dir, classes=classes, num_images=num_images)


def _listed(names: Sequence[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def eval_pipeline(*, input_size: tuple[int, int], crop_pct: float = 0.875,
                  interpolation: str = "bicubic", in_chans: int = 3) -> list[dict]:
    """timm's eval transform as an mm pipeline: resize to size/crop_pct, centre-crop, pack.

    Images load as BGR (``to_rgb`` in the classifier flips them) or, for 1-channel models,
    as grey. Pillow does the resizing, like timm's torchvision transforms.
    """
    if not 0 < crop_pct <= 1:
        raise DataError(f"crop_pct must be in (0, 1], got {crop_pct}")
    h, w = input_size
    load = {"type": "vitbench.LoadImage", "color_type": "grayscale" if in_chans == 1 else "color"}
    if h == w:
        resize = {"type": "mmpretrain.ResizeEdge", "scale": math.floor(h / crop_pct),
                  "edge": "short", "backend": "pillow", "interpolation": interpolation}
    else:  # timm resizes both sides for a non-square input
        resize = {"type": "mmpretrain.Resize",
                  "scale": (math.floor(w / crop_pct), math.floor(h / crop_pct)),
                  "backend": "pillow", "interpolation": interpolation}
    crop = {"type": "mmpretrain.CenterCrop", "crop_size": (w, h)}
    return [load, resize, crop, {"type": "mmpretrain.PackInputs"}]


@TRANSFORMS.register_module(name="LoadImage")
class LoadImage(BaseTransform):
    """Load ``img_path`` as mmcv's ``LoadImageFromFile`` would place it (BGR, or grey for
    ``color_type="grayscale"``), but decoded as timm decodes it
    (:func:`~vitbench.data.read_image.open_image`: Pillow, no EXIF rotation); an image that cannot
    be read is a :class:`DataError` naming the file: an ``error`` record while a run evaluates,
    one line before the runs while a new head is fitted."""

    def __init__(self, color_type: str = "color", to_float32: bool = False) -> None:
        if color_type not in ("color", "grayscale"):
            raise choices_error("color_type", color_type, ("color", "grayscale"))
        self.color_type, self.to_float32 = color_type, to_float32

    def transform(self, results: dict) -> dict:
        """``img``, ``img_shape`` and ``ori_shape`` from the file at ``img_path``."""
        grey = self.color_type == "grayscale"
        img = np.asarray(open_image(results["img_path"], "L" if grey else "RGB"))
        img = np.ascontiguousarray(img if grey else img[..., ::-1])  # mm pipelines take BGR
        results["img"] = img.astype(np.float32) if self.to_float32 else img
        results["img_shape"] = results["ori_shape"] = img.shape[:2]
        return results


@DATASETS.register_module()
class ClsImageFolder(CustomDataset):
    """An image-folder split (see the module docstring) as an mmpretrain data set.

    ``label_map`` maps class-folder names to labels (default: sorted order); images of
    folders it leaves out are skipped. ``classes`` names the labels (default: the folder
    names). ``indices`` (an int: the first N; or a sequence) selects a subset.
    """

    def __init__(self, data_root: str, split: str = "val", *,
                 label_map: Mapping[str, int] | None = None, classes: Sequence[str] | None = None,
                 pipeline: Sequence[Any] = (), indices: int | Sequence[int] | None = None,
                 **kwargs: Any) -> None:
        self.layout = find_split(data_root, split)
        self._label_map = dict(label_map) if label_map is not None else {
            c: i for i, c in enumerate(self.layout.classes)}
        self._classes = tuple(classes) if classes is not None else self.layout.classes
        super().__init__(data_prefix=str(self.layout.split_dir), extensions=IMAGE_EXTENSIONS,
                         pipeline=pipeline, indices=indices, test_mode=split == "val", **kwargs)

    def _find_samples(self) -> list:
        """``(path under the split, class index)`` of every image, class by class, in mmpretrain's
        order, scanned as :func:`_class_images` scans (a link loop ends, a pipe is no image); then
        the class names this data set's labels refer to."""
        self.folder_to_idx = {c: i for i, c in enumerate(self.layout.classes)}
        split = self.layout.split_dir
        samples = [(str(path.relative_to(split)), i) for c, i in self.folder_to_idx.items()
                   for path in _class_images(split / c)]
        self._metainfo["classes"] = self._classes
        return samples

    def load_data_list(self) -> list[dict]:
        """mmpretrain's list, with labels remapped by folder name through ``label_map``."""
        data_list = super().load_data_list()
        folder_of = {i: name for name, i in self.folder_to_idx.items()}
        out = []
        for info in data_list:
            folder = folder_of[info["gt_label"]]
            if folder in self._label_map:
                out.append({**info, "gt_label": self._label_map[folder]})
        return out
