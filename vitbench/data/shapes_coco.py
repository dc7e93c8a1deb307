"""The embedded default data set of ``det`` and ``seg``: COCO-format shapes, generated from a seed.

No package ships COCO images and nothing may be downloaded at run time, so vitbench draws its
own small COCO: circles, squares and triangles with boxes and polygon instance masks on textured
backgrounds, 320x320, in ``train2017``/``val2017`` splits with the usual annotation files. The
same loaders, metrics and ``--data`` check (:func:`find_coco`) serve it and a real COCO root.
Every image comes from its own generator seeded by ``(seed, split, index)``, so the same
settings give the same bytes; :func:`default_shapes_coco` writes the default set once into the
cache. docs/architecture.md, "Embedded defaults", gives each choice and why."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageDraw

from vitbench.data.generated import (  # noqa: F401 (STAMP_FILE re-exported)
    ANN_FILE, IMG_DIR, PNG_COMPRESS_LEVEL, SPLITS, STAMP_FILE, SplitSettings, generated_once, stamped, write_coco,
)
from vitbench.errors import DataError

#: Bump when the drawing or the file layout changes: the cache stamp then no longer matches.
GENERATOR_VERSION = 1
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
CACHE_NAME = "shapes_coco"
EXPECTED_LAYOUT = ("ROOT/annotations/instances_train2017.json, ROOT/annotations/instances_val2017.json, "
                   "ROOT/train2017/ and ROOT/val2017/ (image folders)")

CIRCLE_VERTICES = 48
#: Circumradius range of the objects, as fractions of the image size (12 to 96 px at 320).
MIN_RADIUS = 12 / 320
MAX_RADIUS = 96 / 320
#: Minimum distance (px) between objects' boxes, and between a box and the image border.
GAP = 4
PLACEMENT_TRIES = 50
#: Minimum RGB distance between an object's colour and the background's base colour.
MIN_CONTRAST = 100.0
PIXEL_NOISE = 3.0


@dataclass(frozen=True)
class ShapesSettings(SplitSettings):
    """What the generated data set depends on; the cache stamp hashes all of it."""

    version: ClassVar[int] = GENERATOR_VERSION
    seed: int = 0
    train_images: int = 200
    val_images: int = 50
    size: int = 320
    classes: tuple[str, ...] = SHAPES
    max_objects: int = 4

    def __post_init__(self) -> None:
        if not self.classes or len(set(self.classes)) != len(self.classes) or not set(self.classes) <= set(SHAPES):
            raise ValueError(f"classes must be distinct names among {', '.join(SHAPES)}; got {self.classes!r}")
        if self.train_images < 1 or self.val_images < 1 or self.max_objects < 1:
            raise ValueError("train_images, val_images and max_objects must be at least 1")
        if self.size < 64:
            raise ValueError(f"size must be at least 64 px; got {self.size}")



def generate_shapes_coco(root: str | Path, settings: ShapesSettings | None = None, **overrides: Any) -> Path:
    """Write the shapes data set under ``root`` in COCO layout and return ``root``.

    ``overrides`` replace fields of ``settings`` (default :class:`ShapesSettings`), e.g.
    ``generate_shapes_coco(tmp, seed=1, train_images=8)``. Writes the images, both annotation
    files, and last ``stamp.json`` (generator version and settings hash), so a present stamp
    means the writing finished.
    """
    settings = dataclasses.replace(settings or ShapesSettings(), **overrides)
    def draw(split: str, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, dict[str, Any]]]]:
        pixels, objects = _draw_image(rng, settings)
        return pixels, [(class_index, _annotation(polygon)) for class_index, polygon in objects]

    return write_coco(root, settings, draw, classes=settings.classes, supercategory="shape",
                      description="vitbench generated shapes", generator=__name__)


def is_complete(root: str | Path, settings: ShapesSettings | None = None) -> bool:
    """Whether ``root`` holds a finished set generated with ``settings`` by this generator version."""
    settings = settings or ShapesSettings()
    try:
        find_coco(root)
    except DataError:
        return False
    return stamped(root, settings.digest())


def default_shapes_coco(cache: str | Path | None = None, settings: ShapesSettings | None = None,
                        **overrides: Any) -> Path:
    """The default set's root, ``CACHE/shapes_coco``, generated on first use
    (:func:`~vitbench.data.generated.generated_once`: a missing or foreign stamp, other settings or
    an older generator, regenerates it)."""
    settings = dataclasses.replace(settings or ShapesSettings(), **overrides)
    return generated_once(CACHE_NAME, lambda root: is_complete(root, settings),
                          lambda root: generate_shapes_coco(root, settings), cache)


def find_coco(root: str | Path) -> tuple[Path, Path, Path, Path]:
    """``(train_ann, train_img_dir, val_ann, val_img_dir)`` of a COCO root given with ``--data``.

    Checks only that the paths exist (a real ``instances_train2017.json`` takes a minute to
    parse); a missing one raises :class:`DataError` that names every missing path and the
    expected layout.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"COCO data folder {root} does not exist; expected {EXPECTED_LAYOUT}")
    paths: list[Path] = []
    missing: list[str] = []
    for split in SPLITS:
        ann, img_dir = root / ANN_FILE.format(split=split), root / IMG_DIR.format(split=split)
        paths += [ann, img_dir]
        if not ann.is_file():
            missing.append(str(ann))
        if not img_dir.is_dir():
            missing.append(f"{img_dir}/")
    if missing:
        raise DataError(f"COCO data folder {root} lacks {', '.join(missing)}; expected {EXPECTED_LAYOUT}")
    train_ann, train_img_dir, val_ann, val_img_dir = paths
    return train_ann, train_img_dir, val_ann, val_img_dir


def _draw_image(rng: np.random.Generator, settings: ShapesSettings) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One image (``size x size x 3`` uint8) and its objects as ``(class index, polygon)``."""
    size = settings.size
    base = rng.uniform(40, 215, size=3).astype(np.float32)
    canvas = base + _texture(rng, size)[..., None] * rng.uniform(0.5, 1.0, size=3).astype(np.float32)
    boxes: list[np.ndarray] = []
    objects: list[tuple[int, np.ndarray]] = []
    for _ in range(int(rng.integers(1, settings.max_objects + 1))):
        class_index = int(rng.integers(len(settings.classes)))
        radius = size * math.exp(rng.uniform(math.log(MIN_RADIUS), math.log(MAX_RADIUS)))
        polygon = _place(rng, settings.classes[class_index], radius, size, boxes)
        if polygon is None:
            continue
        box = _extent(polygon)
        _fill(canvas, polygon, _contrasting_colour(rng, base), rng.uniform(-25, 25, size=2) / size)
        boxes.append(box)
        objects.append((class_index, polygon))
    # uniform pixel noise of standard deviation PIXEL_NOISE (drawn 2x faster than Gaussian)
    canvas += (rng.random(size=canvas.shape, dtype=np.float32) - 0.5) * np.float32(PIXEL_NOISE * math.sqrt(12))
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8), objects


def _fill(canvas: np.ndarray, polygon: np.ndarray, colour: np.ndarray, slope: np.ndarray) -> None:
    """Paint ``polygon`` on ``canvas`` in ``colour`` shaded by a linear ramp of ``slope`` per px.

    Works on the polygon's bounding crop (shifted by whole pixels, so PIL rasterises exactly as
    on the full image); the ramp is centred on the crop, +-25 at most across the image.
    """
    x0, y0 = np.floor(polygon.min(axis=0)).astype(int)
    x1, y1 = np.ceil(polygon.max(axis=0)).astype(int) + 1
    mask = Image.new("L", (int(x1 - x0), int(y1 - y0)))
    ImageDraw.Draw(mask).polygon([(float(x - x0), float(y - y0)) for x, y in polygon], fill=1)
    inside = np.asarray(mask, dtype=bool)
    rows, cols = np.nonzero(inside)
    ramp = slope[0] * (cols - cols.mean()) + slope[1] * (rows - rows.mean())
    canvas[y0:y1, x0:x1][inside] = colour[None, :] + ramp[:, None].astype(np.float32)


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """Grey texture around zero: smooth value noise at two scales plus a random grating."""
    out = np.zeros((size, size), dtype=np.float32)
    for cells, amplitude in ((4, 30.0), (16, 12.0)):
        grid = rng.uniform(-1.0, 1.0, size=(cells, cells)).astype(np.float32)
        out += amplitude * np.asarray(Image.fromarray(grid).resize((size, size), Image.Resampling.BICUBIC))
    angle, period = rng.uniform(0, math.pi), rng.uniform(6, 40)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    out += rng.uniform(0, 15) * np.sin((2 * math.pi / period) * (xx * math.cos(angle) + yy * math.sin(angle)))
    return out


def _contrasting_colour(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
    """A random RGB colour at least ``MIN_CONTRAST`` from ``base`` (the farthest of a few draws)."""
    draws = rng.uniform(0, 255, size=(16, 3))
    distances = np.linalg.norm(draws - base, axis=1)
    good = np.flatnonzero(distances >= MIN_CONTRAST)
    return draws[good[0]] if good.size else draws[int(np.argmax(distances))]


def _outline(shape: str, radius: float, angle: float) -> np.ndarray:
    """Vertices (``V x 2``, around the origin) of ``shape`` with circumradius ``radius``."""
    vertices = {"circle": CIRCLE_VERTICES, "square": 4, "triangle": 3}[shape]
    t = angle + 2 * math.pi * np.arange(vertices) / vertices
    return radius * np.stack([np.cos(t), np.sin(t)], axis=1)


def _place(rng: np.random.Generator, shape: str, radius: float, size: int,
           boxes: list[np.ndarray]) -> np.ndarray | None:
    """The shape's polygon at a random free place (rounded to 0.01 px), or None if none found."""
    outline = _outline(shape, radius, rng.uniform(0, 2 * math.pi))
    low, high = outline.min(axis=0), outline.max(axis=0)
    for _ in range(PLACEMENT_TRIES):
        centre = rng.uniform(GAP - low, size - GAP - high)
        polygon = np.round(outline + centre, 2)
        box = _extent(polygon)
        if all(box[0] > b[2] + GAP or b[0] > box[2] + GAP or box[1] > b[3] + GAP or b[1] > box[3] + GAP
               for b in boxes):
            return polygon
    return None


def _extent(polygon: np.ndarray) -> np.ndarray:
    """``[x0, y0, x1, y1]`` of a polygon."""
    return np.concatenate([polygon.min(axis=0), polygon.max(axis=0)])


def _annotation(polygon: np.ndarray) -> dict[str, Any]:
    """A COCO instance's polygon segmentation, its extent as bbox, its shoelace area."""
    x0, y0, x1, y1 = _extent(polygon)
    x, y = polygon[:, 0], polygon[:, 1]
    area = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    return {"segmentation": [[round(float(v), 2) for v in polygon.reshape(-1)]],
            "bbox": [round(float(x0), 2), round(float(y0), 2), round(float(x1 - x0), 2), round(float(y1 - y0), 2)],
            "area": round(area, 2)}
