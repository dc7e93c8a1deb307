"""ImageNet's validation set as people keep it: 50,000 JPEGs in one flat folder, the labels in a file.

Three layouts are recognised under ``--data ROOT`` (besides ``ROOT/val/<synset>/...``, which
:mod:`vitbench.data.image_folder` reads):

- mmpretrain's annotation file: ``ROOT/meta/val.txt`` (``<file> <label 0-999>`` per line) over
  ``ROOT/val/``;
- the Kaggle localisation challenge's ``ROOT/LOC_val_solution.csv`` (``ImageId,PredictionString``,
  the first word of the string the synset) over ``ROOT/ILSVRC/Data/CLS-LOC/val/`` or ``ROOT/val/``;
- the ILSVRC 2012 devkit: ``ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt``
  (one ILSVRC2012_ID per image, in file-name order) with its ``meta.mat`` (ID -> synset) over
  ``ROOT/val/`` or ``ROOT/ILSVRC2012_img_val/``.

Labels index the 1000 synsets, or 0..N-1 for ``meta/val.txt`` read by a model of N < 1,000 classes
(docs/guide/run.md). Each reader checks every line (:func:`labelled_images`), naming file and line.
"""
from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mmpretrain.datasets import CustomDataset

from vitbench.data.image_folder import IMAGE_EXTENSIONS
from vitbench.core.files import special_file
from vitbench.errors import DataError
from vitbench.mm.registry import DATASETS

__all__ = ["FlatVal", "ImageNetVal", "find_flat_val", "flat_val_dataset", "imagenet_synsets", "labelled_images",
           "numbered_classes"]

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
    #: the classes its labels index: ImageNet's 1000, or N for an annotation file of N classes
    num_classes: int = 1000

    def describe(self) -> str:
        """The label file and what its labels index, for a report: ``meta/val.txt, ImageNet labels``."""
        labels = "ImageNet labels" if self.num_classes == 1000 else f"labels 0-{self.num_classes - 1}"
        return f"{self.labels.relative_to(self.root)}, {labels}"


def imagenet_synsets() -> tuple[str, ...]:
    """The 1000 ImageNet synsets (``nXXXXXXXX``) in label order."""
    from timm.data import ImageNetInfo

    return tuple(ImageNetInfo().label_names())


def _first_dir(*candidates: Path) -> Optional[Path]:
    return next((c for c in candidates if c.is_dir()), None)


def find_flat_val(root: str | Path, split: str = "val") -> Optional[FlatVal]:
    """The flat layout of ``split`` under ``root``, or None when it has none of them (a training
    split only as an annotation file, ``meta/train.txt`` over ``train/``)."""
    root = Path(root).expanduser()
    if (root / "meta" / f"{split}.txt").is_file() and (root / split).is_dir():
        return FlatVal(root, "annotation file", root / split, root / "meta" / f"{split}.txt")
    if split != "val":
        return None
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


def _lines(path: Path) -> list[str]:
    """The lines of a label file, read as UTF-8 (a byte-order mark allowed); a special file, an
    unreadable one or bytes that are not UTF-8 are a :class:`DataError` naming the file (and line)."""
    kind = special_file(path)
    if kind is not None:
        raise DataError(f"{path} is {kind}, not a label file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8") from None


def _listed_image(folder: Path, name: str, where: str) -> Path:
    """The image ``name`` a label file lists, which must be a regular file inside ``folder``."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise DataError(f"{where}: image {name!r} is outside {folder}; a label file names images relative to it")
    path = folder / rel
    kind = special_file(path)
    if kind is not None:
        raise DataError(f"{where}: {name!r} is {kind}, not an image")
    if not path.is_file():
        raise DataError(f"{where}: image {name!r} is not in {folder}")
    return path


def _unlisted(images: list[Path], listed: set[Path], split: FlatVal) -> None:
    """An image of the folder that the label file leaves out would silently drop out of the score."""
    left = [p.name for p in images if p not in listed]
    if left:
        raise DataError(f"{len(left)} images of {split.images} are not in {split.labels} (first: {left[0]}); "
                        f"label every image, or move the others out")


def _annotation_labels(split: FlatVal) -> list[tuple[Path, int]]:
    """``meta/val.txt``: ``<image> <label 0..N-1>`` per line, every image of the folder once."""
    seen: dict[Path, int] = {}
    out = []
    classes = split.num_classes
    named = "ImageNet's classes" if classes == 1000 else f"the {classes} classes"
    for n, line in enumerate(_lines(split.labels), start=1):
        if not line.strip():
            continue
        where = f"{split.labels}:{n}"
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2:
            raise DataError(f"{where}: expected '<image> <label 0-{classes - 1}>', got {line.strip()!r}")
        name, text = parts
        try:
            label = int(text)
        except ValueError:
            raise DataError(f"{where}: label {text!r} is not an integer 0-{classes - 1}") from None
        if not 0 <= label < classes:
            raise DataError(f"{where}: label {label} is outside {named} 0-{classes - 1}")
        path = _listed_image(split.images, name.strip(), where)
        if path in seen:
            raise DataError(f"{where}: {name.strip()} is listed again (first on line {seen[path]})")
        seen[path] = n
        out.append((path, label))
    if not out:
        raise DataError(f"{split.labels} lists no images")
    _unlisted(_flat_images(split.images), set(seen), split)
    return out


def _csv_labels(path: Path) -> dict[str, str]:
    """ImageId -> synset from ``LOC_val_solution.csv``; every row once, with a synset."""
    lines = _lines(path)
    labels: dict[str, str] = {}
    first: dict[str, int] = {}
    try:
        reader = csv.reader(lines)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
            raise DataError(f"{path} is not LOC_val_solution.csv: expected the columns ImageId,PredictionString")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row or not any(field.strip() for field in row):
                continue
            if len(row) < 2 or not row[1].split():
                raise DataError(f"{where}: image {row[0]!r} has no prediction string (its first word is the synset)")
            image, synset = row[0].strip(), row[1].split()[0]
            if image in labels:
                raise DataError(f"{where}: image {image!r} has a second row (first on line {first[image]})")
            labels[image], first[image] = synset, reader.line_num
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: not a CSV row ({exc})") from None
    if not labels:
        raise DataError(f"{path} labels no images")
    return labels


def _devkit_synsets(devkit: Path) -> dict[int, str]:
    """ILSVRC2012_ID -> synset from the devkit's ``meta.mat``."""
    from scipy.io import loadmat

    meta = devkit / "meta.mat"
    if not meta.is_file():
        raise DataError(f"{meta} is missing: the devkit's ground truth gives ILSVRC2012_IDs, which it maps to synsets")
    try:
        synsets = loadmat(meta, squeeze_me=True)["synsets"]
        return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets}
    except Exception as exc:  # noqa: BLE001 - scipy raises many kinds (ValueError, NotImplementedError for HDF5, ...)
        raise DataError(f"{meta} is not the devkit's meta.mat (a MATLAB v5 file of synsets with ILSVRC2012_ID "
                        f"and WNID): {type(exc).__name__}: {str(exc)[:200]}") from None


def _devkit_labels(split: FlatVal, images: list[Path]) -> list[tuple[Path, str]]:
    """The devkit's ground truth: one ILSVRC2012_ID per line, for the images in file-name order."""
    rows = [(n, line.strip()) for n, line in enumerate(_lines(split.labels), start=1) if line.strip()]
    if len(rows) != len(images):
        raise DataError(f"{split.labels} labels {len(rows)} images but {split.images} holds {len(images)}; the "
                        f"devkit's ground truth is for the whole validation set, in file-name order")
    synsets = _devkit_synsets(split.labels.parent)
    out = []
    for path, (n, text) in zip(images, rows):
        try:
            wnid = synsets[int(text)]
        except (ValueError, KeyError):
            raise DataError(f"{split.labels}:{n}: {text!r} is not an ILSVRC2012_ID of meta.mat "
                            f"({min(synsets, default=0)}-{max(synsets, default=0)})") from None
        out.append((path, wnid))
    return out


def labelled_images(split: FlatVal) -> list[tuple[Path, int]]:
    """Every validation image of a located layout with its label (the index of its synset among
    the 1000), checked: every image labelled once, every label a class, every name a file inside
    the image folder."""
    if split.layout == "annotation file":
        return _annotation_labels(split)
    images = _flat_images(split.images)
    if not images:
        raise DataError(f"{split.images} holds no images ({' '.join(sorted(IMAGE_EXTENSIONS))})")
    if split.layout == CSV:
        labels = _csv_labels(split.labels)
        stems: dict[str, Path] = {}
        for p in images:
            if p.stem in stems:
                raise DataError(f"{stems[p.stem].name} and {p.name} in {split.images} are one ImageId of "
                                f"{split.labels}; keep one of them")
            stems[p.stem] = p
        missing = [p.name for p in images if p.stem not in labels]
        if missing:
            raise DataError(f"{len(missing)} images of {split.images} have no row in {split.labels} "
                            f"(first: {missing[0]})")
        named = [(p, labels[p.stem]) for p in images]
    else:
        named = _devkit_labels(split, images)
    index = {w: i for i, w in enumerate(imagenet_synsets())}
    for path, wnid in named:
        if wnid not in index:
            raise DataError(f"{path.name}: synset {wnid!r} is not one of the 1000 ImageNet classes")
    return [(path, index[wnid]) for path, wnid in named]


def numbered_classes(n: int) -> tuple[str, ...]:
    """The names of an annotation file's N classes, which it gives by number only: ``0`` .. ``N-1``."""
    return tuple(str(i) for i in range(n))


def flat_val_dataset(split: FlatVal, pipeline: Sequence[Any]) -> dict[str, Any]:
    """The mm data-set config of a located flat validation set."""
    cfg = {"type": "vitbench.ImageNetVal", "data_root": str(split.root), "pipeline": list(pipeline)}
    return cfg if split.num_classes == 1000 else {**cfg, "num_classes": split.num_classes}


@DATASETS.register_module()
class ImageNetVal(CustomDataset):
    """A flat folder labelled by ``meta/<split>.txt``, ``LOC_val_solution.csv`` or the devkit's ground
    truth, as an mmpretrain data set; labels index the 1000 synsets (:func:`imagenet_synsets`), or
    the ``num_classes`` numbered classes of an annotation file of fewer."""

    def __init__(self, data_root: str, pipeline: Sequence[Any] = (), indices: int | Sequence[int] | None = None,
                 split: str = "val", num_classes: int = 1000, **kwargs: Any) -> None:
        found = find_flat_val(data_root, split)
        if found is None:
            raise DataError(f"{data_root} has no meta/{split}.txt" + (f", {CSV} or devkit ground truth"
                                                                       if split == "val" else f" over {split}/"))
        if num_classes != 1000 and found.layout != "annotation file":
            raise DataError(f"{found.labels} labels ImageNet's 1000 synsets; only meta/val.txt can name fewer classes")
        self.split = dataclasses.replace(found, num_classes=num_classes)
        classes = imagenet_synsets() if num_classes == 1000 else numbered_classes(num_classes)
        super().__init__(data_root=data_root, data_prefix=str(found.images), pipeline=pipeline, indices=indices,
                         test_mode=split == "val", metainfo={"classes": classes}, **kwargs)

    def load_data_list(self) -> list[dict]:
        """One dict per image: its path and its synset's index."""
        return [{"img_path": str(path), "gt_label": label} for path, label in labelled_images(self.split)]
