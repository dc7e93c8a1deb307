"""A COCO set vitbench generates (:func:`write_coco`) into its cache once: written to a temporary
sibling folder, stamped last, and renamed into place when complete, so an interrupted run never
leaves a folder that looks finished (the shapes COCO set, :mod:`vitbench.data.shapes_coco`; the
Fashion-MNIST scenes, :mod:`vitbench.data.fmnist_scenes`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
from PIL import Image

from vitbench.core.cache import cache_dir

__all__ = ["ANN_FILE", "IMG_DIR", "PNG_COMPRESS_LEVEL", "SPLITS", "STAMP_FILE", "SplitSettings", "generated_once",
           "stamped", "write_coco", "write_stamp"]

STAMP_FILE = "stamp.json"
SPLITS: tuple[str, ...] = ("train", "val")
#: File and folder names of the standard COCO 2017 layout.
ANN_FILE = "annotations/instances_{split}2017.json"
IMG_DIR = "{split}2017"
#: zlib level of the PNGs: several times faster to write than the default for ~15 % more bytes
PNG_COMPRESS_LEVEL = 1
#: an item of a drawn image: its category index and its annotation's segmentation, bbox and area
Item = tuple[int, dict[str, Any]]


class SplitSettings:
    """What a generated COCO set's settings (a frozen dataclass) share: the images of each split
    and the digest its cache stamp keeps (generator version and every field)."""

    version: ClassVar[int]
    train_images: int
    val_images: int

    def images(self, split: str) -> int:
        """Number of images in ``split``."""
        return self.train_images if split == "train" else self.val_images

    def digest(self) -> str:
        """SHA-256 of the generator version and these settings (the cache stamp's key)."""
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]
        blob = json.dumps({"version": self.version, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def write_coco(root: str | Path, settings: Any, draw: Callable[[str, np.random.Generator], tuple[np.ndarray, list[Item]]],
               *, classes: Sequence[str], supercategory: str, description: str, generator: str) -> Path:
    """Write a generated set under ``root`` in COCO layout -- each image of each split drawn by
    ``draw(split, rng)`` with a generator seeded by ``(seed, split, index)``, saved as a PNG, both annotation files, and the stamp last -- and return ``root``."""
    root = Path(root)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    categories = [{"id": i + 1, "name": name, "supercategory": supercategory} for i, name in enumerate(classes)]
    for split_index, split in enumerate(SPLITS):
        img_dir = root / IMG_DIR.format(split=split)
        img_dir.mkdir(exist_ok=True)
        images: list[dict[str, Any]] = []
        annotations: list[dict[str, Any]] = []
        for index in range(settings.images(split)):
            pixels, items = draw(split, np.random.default_rng([settings.seed, split_index, index]))
            image_id = index + 1
            file_name = f"{image_id:012d}.png"
            Image.fromarray(pixels).save(img_dir / file_name, compress_level=PNG_COMPRESS_LEVEL)
            images.append({"id": image_id, "file_name": file_name, "width": settings.size, "height": settings.size})
            for category, fields in items:
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category + 1,
                                    **fields, "iscrowd": 0})
        coco = {"info": {"description": description, "version": str(settings.version),
                         "settings": dataclasses.asdict(settings)},
                "licenses": [], "images": images, "annotations": annotations, "categories": categories}
        (root / ANN_FILE.format(split=split)).write_text(json.dumps(coco, separators=(",", ":")) + "\n")
    write_stamp(root, generator, settings.version, dataclasses.asdict(settings), settings.digest())
    return root


def write_stamp(root: Path, generator: str, version: int, settings: dict[str, Any], digest: str) -> None:
    """Write ``root``'s stamp, last: its presence means the writing finished."""
    stamp = {"generator": generator, "version": version, "settings": settings, "settings_hash": digest}
    (root / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")


def stamped(root: str | Path, digest: str) -> bool:
    """Whether ``root`` holds a stamp with this settings hash."""
    try:
        stamp = json.loads((Path(root) / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("settings_hash") == digest


def generated_once(name: str, complete: Callable[[Path], bool], generate: Callable[[Path], Any],
                   cache: Optional[str | Path] = None) -> Path:
    """``CACHE/name``, made by ``generate(folder)`` unless ``complete(CACHE/name)``.

    ``cache`` defaults to vitbench's cache folder (``$VITBENCH_CACHE`` or ``~/.cache/vitbench``).
    A stale or half-written folder is replaced; if another process finishes first, its copy is
    kept and ours discarded."""
    parent = cache_dir(cache)
    target = parent / name
    if complete(target):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent))
    try:
        generate(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a cache folder is an ordinary folder
        if target.exists():  # stale or half-written: move it aside, then drop it
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent))
            try:
                os.replace(target, old / name)
            except FileNotFoundError:  # another process moved it first
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
