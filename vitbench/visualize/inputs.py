"""What a figure is drawn from: a ViT/DeiT model and one image, checked before anything heavy runs.

The model is the embedded default (its shipped weights) or a timm model with random weights
(``--checkpoint`` loads local ones; nothing is downloaded). The image is a Fashion-MNIST test image
(padded to 32x32 as the default model sees it, then resized to the model's input) or a file,
resized to the model's input without cropping, so the patch grid lies on the whole picture.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from vitbench.errors import DataError, ParamError, UnsupportedError
from vitbench.tasks.embedded import DEFAULT_MODEL, EMBEDDED_MODELS
from vitbench.data.fashion_mnist import CLASSES, load_fashion_mnist, pad_images
from vitbench.data.input_config import input_config
from vitbench.data.read_image import open_image
from vitbench.host import get_host
from vitbench.results.writable import check_writable
from vitbench.tasks.models import load_model
from vitbench.tasks.model_names import unknown_model

__all__ = ["check_blocks", "check_image_source", "check_out", "check_vit_name", "default_blocks", "load_image",
           "load_vit", "parse_blocks"]

#: Fashion-MNIST test images (``--index`` runs over 0 .. this - 1)
TEST_IMAGES = 10000


def check_vit_name(name: str) -> None:
    """Refuse a model name timm does not know, or one that is no ViT/DeiT, without loading weights
    (the model is built on the meta device)."""
    if name in EMBEDDED_MODELS:
        return
    import timm

    if not timm.is_model(name):
        raise unknown_model(name, DEFAULT_MODEL)
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    try:
        family = get_host().family_of(model).name
    except UnsupportedError:
        family = "none"
    if family != "vit":
        raise UnsupportedError(f"visualize supports ViT/DeiT models; got {name} (a {type(model).__name__}, "
                               f"family {family}); e.g. deit_tiny_patch16_224, vit_base_patch16_224 or "
                               f"{DEFAULT_MODEL}")


def check_image_source(image: Optional[str], index: Optional[int]) -> None:
    """Refuse a missing image file or a Fashion-MNIST index out of range (before the model loads)."""
    if image is not None:
        path = Path(image).expanduser()
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            raise DataError(f"--image {image!r} {what}; give the path of an image file (PNG, JPEG)")
    elif index is not None and not 0 <= index < TEST_IMAGES:
        raise ParamError(f"--index {index} is out of range; Fashion-MNIST has {TEST_IMAGES} test images: "
                         f"0 .. {TEST_IMAGES - 1}")


def parse_blocks(text: Optional[str]) -> Optional[list[int]]:
    """``"3,6,9"`` -> ``[3, 6, 9]`` (``None`` when not given: :func:`default_blocks`)."""
    if text is None:
        return None
    blocks = []
    for item in (part.strip() for part in text.split(",")):
        try:
            blocks.append(int(item))
        except ValueError:
            raise ParamError(f"--blocks {text!r}: {item!r} is not a block index; give 0-based "
                             f"indices, e.g. 3,6,9") from None
    if not blocks:
        raise ParamError(f"--blocks {text!r} names no block; give 0-based indices, e.g. 3,6,9")
    return list(dict.fromkeys(blocks))


def default_blocks(depth: int) -> list[int]:
    """Four blocks spread over the depth, the last one included (2, 5, 8, 11 for 12 blocks)."""
    return sorted({max(0, round((k + 1) * depth / 4) - 1) for k in range(4)})


def check_blocks(blocks: list[int], depth: int, model: str) -> None:
    """Refuse a block index the model lacks, naming the valid range."""
    bad = [b for b in blocks if not 0 <= b < depth]
    if bad:
        raise ParamError(f"--blocks {','.join(map(str, bad))} is out of range; {model} has {depth} blocks: "
                         f"valid blocks are 0 .. {depth - 1}")


def load_vit(name: str, checkpoint: Optional[str] = None, seed: int = 0, pretrained: bool = False) -> nn.Module:
    """The model in eval mode: the default one, or timm's ``name`` with random weights drawn from
    ``seed`` (or a local ``checkpoint``; ``pretrained``: timm's, from the hub, as a run asked)."""
    check_vit_name(name)
    return load_model(name, checkpoint=checkpoint, seed=seed, pretrained=pretrained)


def load_image(model: nn.Module, image: Optional[str], index: int) -> tuple[torch.Tensor, np.ndarray, str]:
    """``(input [1, C, H, W] normalised, picture [H, W, 3] in 0..1, caption)`` for ``model``."""
    from PIL import Image

    cfg = input_config(model)
    h, w = cfg.input_size
    mode = "L" if cfg.in_chans == 1 else "RGB"
    if image is not None:
        try:
            picture = open_image(Path(image).expanduser(), mode).resize((w, h), Image.Resampling.BICUBIC)
        except DataError as exc:
            raise DataError(f"--image {image!r}: {exc}") from None
        caption = Path(image).name
    else:
        images, labels = load_fashion_mnist("test")
        side = h if h == w and images.shape[1] <= h <= 32 else 32  # as the evaluation pads it
        padded = pad_images(images[index:index + 1], side)[0]
        picture = Image.fromarray(padded).convert(mode).resize((w, h), Image.Resampling.BILINEAR)
        caption = f"Fashion-MNIST test #{index} ({CLASSES[int(labels[index])]})"
    pixels = np.asarray(picture, dtype=np.float32) / 255.0
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    mean = np.asarray(cfg.mean, dtype=np.float32)
    std = np.asarray(cfg.std, dtype=np.float32)
    x = torch.from_numpy(((pixels - mean) / std).transpose(2, 0, 1).copy())[None]
    shown = np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels
    return x, shown, caption


def check_out(out: str) -> Path:
    """The output folder, proven writable (created and removed again if new) before anything runs."""
    if not out.strip():
        raise ParamError("--out '' is empty; name a folder for the figure")
    path = Path(out).expanduser()
    check_writable(path, path / ".vitbench-visualize")
    return path
