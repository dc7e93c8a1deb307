"""Fashion-MNIST scenes: a COCO-format det/seg set of real images, made from the Fashion-MNIST package.

Each canvas (192x192, grey) holds 2 to 6 garments drawn from Fashion-MNIST (its train split for
``train2017``, its test split for ``val2017``), each scaled 1.5x to 4x (42 to 112 px) and placed
at random; later items lie in front, and an item keeps at least half of its pixels visible. An
item's pixels are those of its garment above :data:`INK` (a quarter of full brightness); its mask
is the visible part of them (uncompressed RLE), its box that mask's extent, its class the
garment's. The background is a dark grey ramp with pixel noise. Everything comes from generators
seeded by ``(seed, split, index)``, so the same settings give the same bytes; :func:`default_fmnist_scenes`
writes the default set once into the cache (:mod:`vitbench.data.generated`). docs/architecture.md,
"Embedded defaults".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
from PIL import Image

from vitbench.data.fashion_mnist import CLASSES, load_fashion_mnist
from vitbench.data.generated import SPLITS, SplitSettings, generated_once, stamped, write_coco
from vitbench.data.shapes_coco import find_coco
from vitbench.errors import DataError

__all__ = ["CACHE_NAME", "INK", "ScenesSettings", "default_fmnist_scenes", "generate_fmnist_scenes",
           "is_complete"]

#: Bump when the drawing or the file layout changes: the cache stamp then no longer matches.
GENERATOR_VERSION = 1
CACHE_NAME = "fmnist_scenes"
#: a garment's pixel belongs to it above this share of full brightness
INK = 0.25
#: the least share of an item's pixels that must stay visible in front of the items after it
MIN_VISIBLE = 0.5
PLACEMENT_TRIES = 20
#: Fashion-MNIST's split each COCO split draws its garments from
SOURCE = {"train": "train", "val": "test"}


@dataclass(frozen=True)
class ScenesSettings(SplitSettings):
    """What the generated set depends on; the cache stamp hashes all of it."""

    version: ClassVar[int] = GENERATOR_VERSION
    seed: int = 0
    train_images: int = 3000
    val_images: int = 500
    size: int = 192
    min_items: int = 2
    max_items: int = 6
    min_scale: float = 1.5
    max_scale: float = 4.0

    def __post_init__(self) -> None:
        if self.train_images < 1 or self.val_images < 1:
            raise ValueError("train_images and val_images must be at least 1")
        if not 1 <= self.min_items <= self.max_items:
            raise ValueError(f"need 1 <= min_items <= max_items; got {self.min_items}, {self.max_items}")
        if not 1.0 <= self.min_scale <= self.max_scale or 28 * self.max_scale > self.size:
            raise ValueError(f"need 1 <= min_scale <= max_scale and 28 * max_scale <= size; got {self.min_scale}, "
                             f"{self.max_scale}, size {self.size}")



def generate_fmnist_scenes(root: str | Path, settings: Optional[ScenesSettings] = None, *,
                           data_dir: Optional[str | Path] = None, **overrides: Any) -> Path:
    """Write the scenes under ``root`` in COCO layout (images, both annotation files, the stamp
    last) and return ``root``; ``overrides`` replace fields of ``settings``."""
    settings = dataclasses.replace(settings or ScenesSettings(), **overrides)
    sources = {split: load_fashion_mnist(SOURCE[split], data_dir) for split in SPLITS}

    def draw(split: str, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, dict[str, Any]]]]:
        pixels, items = _scene(rng, settings, *sources[split])
        return pixels, [(label, _annotation(mask)) for label, mask in items]

    return write_coco(root, settings, draw, classes=CLASSES, supercategory="garment",
                      description="vitbench Fashion-MNIST scenes", generator=__name__)


def is_complete(root: str | Path, settings: Optional[ScenesSettings] = None) -> bool:
    """Whether ``root`` holds a finished set made with ``settings`` by this generator version."""
    try:
        find_coco(root)
    except DataError:
        return False
    return stamped(root, (settings or ScenesSettings()).digest())


def default_fmnist_scenes(cache: Optional[str | Path] = None, settings: Optional[ScenesSettings] = None,
                          **overrides: Any) -> Path:
    """The default scenes' root, ``CACHE/fmnist_scenes``, generated on first use."""
    settings = dataclasses.replace(settings or ScenesSettings(), **overrides)
    return generated_once(CACHE_NAME, lambda root: is_complete(root, settings),
                          lambda root: generate_fmnist_scenes(root, settings), cache)


def _scene(rng: np.random.Generator, settings: ScenesSettings, garments: np.ndarray,
           labels: np.ndarray) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One canvas (``size x size`` uint8) and its visible items as ``(label, mask)``."""
    size = settings.size
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    slope = rng.uniform(-20, 20, size=2).astype(np.float32)
    canvas = rng.uniform(10, 60) + slope[0] * xx + slope[1] * yy
    owner = np.full((size, size), -1, dtype=np.int64)  # which item each pixel shows
    placed: list[tuple[int, int]] = []  # (label, pixel count) of each item drawn
    for _ in range(int(rng.integers(settings.min_items, settings.max_items + 1))):
        pick = int(rng.integers(len(garments)))
        side = int(round(28 * rng.uniform(settings.min_scale, settings.max_scale)))
        alpha = np.asarray(Image.fromarray(garments[pick]).resize((side, side), Image.Resampling.BILINEAR),
                           dtype=np.float32) / 255.0
        ink = alpha > INK
        if not ink.any():
            continue
        visible = np.bincount(owner[owner >= 0], minlength=len(placed))
        for _ in range(PLACEMENT_TRIES):
            y, x = (int(v) for v in rng.integers(0, size - side + 1, size=2))
            region = owner[y:y + side, x:x + side]
            hidden = region[ink]
            covered = np.bincount(hidden[hidden >= 0], minlength=len(placed))
            if all(visible[i] - covered[i] >= MIN_VISIBLE * n for i, (_, n) in enumerate(placed)):
                break
        else:
            continue  # no place leaves every earlier item half visible
        brightness = rng.uniform(0.7, 1.0) * 255.0
        window = canvas[y:y + side, x:x + side]
        window[...] = window * (1 - alpha) + brightness * alpha
        region[ink] = len(placed)
        placed.append((int(labels[pick]), int(np.count_nonzero(ink))))
    canvas += rng.normal(0, 3.0, size=canvas.shape).astype(np.float32)
    pixels = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    items = [(label, owner == i) for i, (label, _) in enumerate(placed) if np.any(owner == i)]
    return pixels, items


def _rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE of a binary mask: run lengths in column-major order, zeros first."""
    flat = mask.reshape(-1, order="F").astype(np.uint8)
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]]))
    counts = ([0] if flat[0] else []) + runs.tolist()
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


def _annotation(mask: np.ndarray) -> dict[str, Any]:
    """A COCO instance's visible mask as RLE, its extent as bbox, its pixel count as area."""
    rows, cols = np.nonzero(mask)
    x0, y0, x1, y1 = int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1
    return {"segmentation": _rle(mask), "bbox": [x0, y0, x1 - x0, y1 - y0], "area": int(mask.sum())}
