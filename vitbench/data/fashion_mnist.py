"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist``: reader and mm data set.

The embedded default (docs/architecture.md, "Embedded defaults") trains and evaluates on real data
without any download, so the data come from an OS package that puts the four IDX ``.gz`` files
in ``/usr/share/datasets/fashion-mnist/``. ``VITBENCH_FASHION_MNIST_DIR`` points elsewhere
(e.g. a copy on a machine without the package). Missing files raise a :class:`DataError` that
says how to install them; nothing is ever fetched from the network.

The images stay in memory as one uint8 array (60k x 32 x 32 = 61 MB for train); mmengine's
per-item list holds only indices and labels, so it serialises quickly and data-loader workers
share the array.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from mmpretrain.datasets import BaseDataset

from vitbench.data.idx import read_idx
from vitbench.errors import DataError, choices_error
from vitbench.mm.registry import DATASETS

ENV_DIR = "VITBENCH_FASHION_MNIST_DIR"
DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL_HINT = ("install it with `sudo apt-get update && sudo apt-get install dataset-fashion-mnist` "
                f"(or `make install`), or set {ENV_DIR} to a folder holding the IDX files")

CLASSES: tuple[str, ...] = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
SPLITS: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SPLIT_SIZES: dict[str, int] = {"train": 60000, "test": 10000}
IMAGE_SIZE = 28


def fashion_mnist_dir(data_dir: str | Path | None = None) -> Path:
    """The folder to read: ``data_dir``, else ``$VITBENCH_FASHION_MNIST_DIR``, else Debian's."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_DIR)
    return Path(env).expanduser() if env else DEFAULT_DIR


def _find(folder: Path, stem: str) -> Path:
    """The IDX file ``stem`` in ``folder`` (gzipped as Debian ships it, or already unpacked)."""
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise DataError(f"Fashion-MNIST file {folder / (stem + '.gz')} is missing; {INSTALL_HINT}")


def fashion_mnist_files(split: str = "test", data_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Paths of ``split``'s (images, labels) files; a missing file raises :class:`DataError`."""
    if split not in SPLITS:
        raise choices_error("Fashion-MNIST split", split, SPLITS)
    folder = fashion_mnist_dir(data_dir)
    images, labels = SPLITS[split]
    return _find(folder, images), _find(folder, labels)


@functools.lru_cache(maxsize=4)
def _load_cached(images: Path, labels: Path, _stamp: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Decode once per process (train takes ~0.5 s); the mtimes in ``_stamp`` key the cache."""
    x = read_idx(images)
    y = read_idx(labels)
    if x.ndim != 3 or x.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE) or x.dtype != np.uint8:
        raise DataError(f"malformed Fashion-MNIST images {images}: shape {x.shape} {x.dtype}, "
                        f"expected (N, {IMAGE_SIZE}, {IMAGE_SIZE}) uint8")
    if y.ndim != 1 or len(y) != len(x) or (len(y) and int(y.max()) >= len(CLASSES)):
        raise DataError(f"malformed Fashion-MNIST labels {labels}: {y.shape} for {len(x)} images")
    y = y.astype(np.int64)
    x.flags.writeable = False  # shared by every caller: nobody may edit the cached copy
    y.flags.writeable = False
    return x, y


def load_fashion_mnist(split: str = "test", data_dir: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read ``split`` as ``(images uint8 [N, 28, 28], labels int64 [N])`` (read-only arrays).

    ``split`` is ``"train"`` (60,000 images) or ``"test"`` (10,000).
    """
    images, labels = fashion_mnist_files(split, data_dir)
    stamp = (images.stat().st_mtime, labels.stat().st_mtime)
    return _load_cached(images.resolve(), labels.resolve(), stamp)


def pad_images(images: np.ndarray, size: int) -> np.ndarray:
    """Zero-pad ``[N, 28, 28]`` images centred to ``size`` (28 -> 32 gives the ViT 8x8 patches of 4).

    Zero is the data set's background, so padding adds no signal.
    """
    n, h, w = images.shape
    if size < max(h, w):
        raise DataError(f"cannot pad {h}x{w} Fashion-MNIST images to {size}; use a size >= {max(h, w)}")
    top, left = (size - h) // 2, (size - w) // 2
    out = np.zeros((n, size, size), dtype=images.dtype)
    out[:, top:top + h, left:left + w] = images
    return out


@DATASETS.register_module()
class OfflineFashionMNIST(BaseDataset):
    """Fashion-MNIST as an mmpretrain data set, read from local IDX files (never downloads).

    Named apart from mmpretrain's own ``FashionMNIST`` (which downloads) so an unscoped config
    type can never pick the wrong one. Each item's ``img`` is ``[pad_to, pad_to]`` uint8 (one
    channel; ``PackInputs`` adds the channel axis) or ``[pad_to, pad_to, 3]`` with
    ``channels=3`` for RGB backbones. ``indices`` (an int: the first N; or a sequence) selects
    a subset, as in every mmengine data set.
    """

    METAINFO: ClassVar[dict[str, Any]] = {"classes": CLASSES}

    def __init__(self, split: str = "test", data_dir: str | None = None, pad_to: int = 32,
                 channels: int = 1, pipeline: Sequence[Any] = ({"type": "mmpretrain.PackInputs"},),
                 indices: int | Sequence[int] | None = None, test_mode: bool | None = None,
                 **kwargs: Any) -> None:
        if channels not in (1, 3):
            raise DataError(f"Fashion-MNIST channels must be 1 or 3, got {channels!r}")
        self.split = split
        self.channels = channels
        self.pad_to = pad_to
        raw, self._labels = load_fashion_mnist(split, data_dir)
        self._images = pad_images(raw, pad_to)
        self._images.flags.writeable = False
        super().__init__(ann_file="", pipeline=pipeline, indices=indices,
                         test_mode=(split == "test") if test_mode is None else test_mode, **kwargs)

    def load_data_list(self) -> list[dict]:
        """One small dict per image: its row in the in-memory array and its label."""
        return [{"img_index": i, "gt_label": int(label)} for i, label in enumerate(self._labels)]

    def get_data_info(self, idx: int) -> dict:
        """Attach the image array (a view, channels replicated for RGB backbones) to the item."""
        info = super().get_data_info(idx)
        img = self._images[info["img_index"]]
        info["img"] = np.repeat(img[:, :, None], 3, axis=2) if self.channels == 3 else img.copy()
        info["img_shape"] = img.shape[:2]
        info["ori_shape"] = img.shape[:2]
        return info

    def extra_repr(self) -> list[str]:
        """Shown by ``repr`` instead of mmpretrain's annotation-file lines."""
        return [f"Split: \t{self.split}", f"Padded to: \t{self.pad_to}", f"Channels: \t{self.channels}"]
