"""Which images the cls task evaluates on: ``--data`` resolved against the model.

``None`` or ``"fashion-mnist"`` is the embedded Fashion-MNIST test split (a folder literally
named ``fashion-mnist`` is reached as ``./fashion-mnist``); anything else is a path to an
image folder (:mod:`vitbench.data.image_folder`) or a flat ImageNet validation folder
(:mod:`vitbench.data.imagenet_val`). The result, :class:`ClsData`, is an mm
data-set config plus what the evaluator needs to know about it; the data set itself is built
inside the runner, so every evaluation reads it fresh.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from vitbench.data.fashion_mnist import CLASSES as FMNIST_CLASSES
from vitbench.data.fashion_mnist import IMAGE_SIZE as FMNIST_SIZE
from vitbench.data.fashion_mnist import fashion_mnist_files
from vitbench.data.image_folder import eval_pipeline, find_split
from vitbench.data.imagenet_val import FlatVal, find_flat_val, flat_val_dataset, imagenet_synsets, numbered_classes
from vitbench.data.input_config import input_config
from vitbench.errors import DataError

FASHION_MNIST = "fashion-mnist"
_FMNIST_ALIASES = {FASHION_MNIST, "fashion_mnist", "fmnist"}
_WNID = re.compile(r"n\d{8}")


@dataclass(frozen=True)
class ClsData:
    """An evaluation data set for the cls task.

    ``dataset`` is the mm config dict of the data set (types in the ``vitbench`` registry);
    ``bgr`` says whether images arrive as BGR (mmcv's loader), so the classifier flips them to
    RGB for 3-channel models.
    """

    name: str
    dataset: dict[str, Any] = field(compare=False)
    num_classes: int
    classes: tuple[str, ...] = field(repr=False)
    bgr: bool = False
    #: the same evaluation images read from the decoded-image cache (:mod:`vitbench.data.decoded`)
    decoded: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    #: how a folder was read (``flat folder, meta/val.txt, labels 0-9``); None: Fashion-MNIST
    layout: str | None = None

    def dataset_cfg(self, *, limit: int | None = None) -> dict[str, Any]:
        """A copy of the evaluation data-set config (the decoded cache's when there is one);
        ``limit`` keeps only the first N images."""
        cfg = copy.deepcopy(self.decoded or self.dataset)
        if limit is not None:
            cfg["indices"] = int(limit)
        return cfg

    def train_cfg(self, *, limit: int | None = None) -> dict[str, Any]:
        """The config of the matching training split (what learnable methods fine-tune on).

        Same preprocessing as evaluation (no augmentation: the fine-tuning setup trains only a
        method's few parameters, briefly). Fashion-MNIST: its 60k training images; a folder:
        ``ROOT/train`` (a missing one raises :class:`DataError` naming the path).
        """
        cfg = copy.deepcopy(self.dataset)
        numbered = cfg.pop("num_classes", None) if cfg["type"] == "vitbench.ImageNetVal" else None
        if numbered is not None and find_flat_val(cfg["data_root"], "train") is not None:
            cfg["num_classes"] = numbered  # meta/train.txt over train/, labels 0..N-1
        elif cfg["type"] == "vitbench.ImageNetVal":  # a flat val/: train/<class>/, by synset or in sorted order
            names = imagenet_synsets() if numbered is None else None
            cfg = {"type": "vitbench.ClsImageFolder", "data_root": cfg["data_root"], "pipeline": cfg["pipeline"],
                   **({"label_map": {w: i for i, w in enumerate(names)}, "classes": names} if names else {})}
        if limit is not None:
            cfg["indices"] = int(limit)
        if cfg["type"] == "vitbench.ClsImageFolder":
            train = find_split(cfg["data_root"], "train")  # a clear error when ROOT/train is missing
            if numbered is not None and len(train.classes) != numbered:
                raise DataError(f"{train.split_dir} has {len(train.classes)} class folders but the evaluation "
                                f"labels (meta/val.txt) name {numbered} classes, which train/ gives in sorted "
                                f"folder order; give as many folders, or meta/train.txt over train/")
        cfg["split"] = "train"
        return cfg

    def build(self, *, limit: int | None = None) -> Any:
        """Build the mm data set (mainly for tests and inspection)."""
        from mmengine.registry import DATASETS, DefaultScope

        with DefaultScope.overwrite_default_scope("mmpretrain"):
            return DATASETS.build(self.dataset_cfg(limit=limit))


def _model_classes(model: nn.Module) -> int | None:
    n = getattr(model, "num_classes", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def _fashion_mnist(model: nn.Module) -> ClsData:
    fashion_mnist_files("test")  # fail now, with the install hint, if the data is missing
    cfg = input_config(model)
    n_out = _model_classes(model)
    if n_out is not None and n_out != len(FMNIST_CLASSES):
        raise DataError(f"{FASHION_MNIST} has {len(FMNIST_CLASSES)} classes but the model predicts "
                        f"{n_out}; use a model with num_classes=10 (--num-classes 10) or --data FOLDER")
    if cfg.in_chans not in (1, 3):
        raise DataError(f"{FASHION_MNIST} is grey; a model with {cfg.in_chans} input channels cannot use it")
    pipeline: list[dict[str, Any]] = []
    height, width = cfg.input_size
    # a square input of 28-32 pixels is the image zero-padded; anything else (e.g. a 224-pixel
    # ImageNet backbone fine-tuned on it) is the 32-pixel image resized
    pad_to = height if height == width and FMNIST_SIZE <= height <= 32 else 32
    if (height, width) != (pad_to, pad_to):
        pipeline.append({"type": "mmpretrain.Resize", "scale": (width, height),
                         "backend": "pillow", "interpolation": cfg.interpolation})
    pipeline.append({"type": "mmpretrain.PackInputs"})
    dataset = {"type": "vitbench.OfflineFashionMNIST", "split": "test", "pad_to": pad_to,
               "channels": cfg.in_chans, "pipeline": pipeline}
    return ClsData(name=FASHION_MNIST, dataset=dataset, num_classes=len(FMNIST_CLASSES),
                   classes=FMNIST_CLASSES, bgr=False)


def _imagenet_labels(classes: tuple[str, ...], n_out: int | None) -> tuple[dict[str, int], tuple[str, ...]] | None:
    """ImageNet ``nXXXXXXXX`` folders for a 1000-class model: labels by the synset index.

    Sorted-folder numbering is only right when all 1000 classes are present; with this map a
    folder holding a subset of the classes is still labelled correctly.
    """
    if n_out != 1000 or not all(_WNID.fullmatch(c) for c in classes):
        return None
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    names = list(info.label_names())
    index = {w: i for i, w in enumerate(names)}
    if len(names) != 1000 or not all(c in index for c in classes):
        return None
    return {c: index[c] for c in classes}, tuple(names)


def _flat_val(split: FlatVal, model: nn.Module) -> ClsData:
    """A flat validation folder (:mod:`vitbench.data.imagenet_val`): ImageNet's 1000 classes, or,
    read by a model of N < 1,000 classes from ``meta/val.txt``, those N classes (labels 0..N-1)."""
    cfg = input_config(model)
    n_out = _model_classes(model)
    if split.layout == "annotation file" and n_out is not None and n_out < 1000:
        split = dataclasses.replace(split, num_classes=n_out)
    elif n_out is not None and n_out != 1000:
        raise DataError(f"{split.root} is ImageNet's validation set ({split.layout}), 1000 classes, but the model "
                        f"predicts {n_out}; use a 1000-class ImageNet model or an image folder of your classes"
                        + ("" if split.layout == "annotation file" else " (meta/val.txt over val/ may name fewer)"))
    classes = imagenet_synsets() if split.num_classes == 1000 else numbered_classes(split.num_classes)
    pipeline = eval_pipeline(input_size=cfg.input_size, crop_pct=cfg.crop_pct, interpolation=cfg.interpolation,
                             in_chans=cfg.in_chans)
    return ClsData(name=str(split.root), dataset=flat_val_dataset(split, pipeline), num_classes=len(classes),
                   classes=classes, bgr=cfg.in_chans == 3, layout=f"flat folder, {split.describe()}")


def _folder(path: str, model: nn.Module) -> ClsData:
    flat = find_flat_val(path)
    if flat is not None:
        return _flat_val(flat, model)
    split = find_split(path, "val")
    cfg = input_config(model)
    n_out = _model_classes(model)
    imagenet = _imagenet_labels(split.classes, n_out)
    if imagenet is not None:
        label_map, classes = imagenet
    else:
        label_map, classes = {c: i for i, c in enumerate(split.classes)}, split.classes
        if n_out is not None and len(classes) != n_out:  # labels 0..K-1 would mean other classes
            raise DataError(f"data folder {split.split_dir} has {len(classes)} classes but the model "
                            f"predicts {n_out}: its head would be scored against other labels; pass "
                            f"--num-classes {len(classes)} (fits a new {len(classes)}-way head on the "
                            f"train/ split, backbone frozen) or a --checkpoint whose head has "
                            f"{len(classes)} classes")
    dataset = {"type": "vitbench.ClsImageFolder", "data_root": str(split.root), "split": "val",
               "label_map": label_map, "classes": classes,
               "pipeline": eval_pipeline(input_size=cfg.input_size, crop_pct=cfg.crop_pct,
                                         interpolation=cfg.interpolation, in_chans=cfg.in_chans)}
    layout = "synset folders, ImageNet labels" if imagenet is not None else "class folders"
    return ClsData(name=str(split.root), dataset=dataset, num_classes=len(split.classes),
                   classes=tuple(classes), bgr=cfg.in_chans == 3, layout=layout)


def is_fashion_mnist(arg: str | None) -> bool:
    """Whether ``--data`` names the embedded Fashion-MNIST (none given, or one of its names)."""
    return arg is None or arg.strip().lower() in _FMNIST_ALIASES


def resolve_cls_data(arg: str | None, model: nn.Module) -> ClsData:
    """Resolve ``--data`` for ``model``: ``None``/``"fashion-mnist"`` or an image-folder path.

    The preprocessing follows the model's input config (size, crop_pct, channels). Missing or
    malformed data raise :class:`DataError` naming the path and the expected layout.
    """
    if is_fashion_mnist(arg):
        return _fashion_mnist(model)
    return _folder(arg, model)
