"""One guarded image reader for every command (evaluation, fine-tuning, ``visualize``,
``reproduce``): an image is decoded as timm's loader decodes it (Pillow, converted to RGB or grey,
the EXIF orientation tag not applied), and a file that is not an image, a pipe or a device, or a
header that declares more pixels than Pillow's bomb limit, is a :class:`~vitbench.errors.DataError`
naming the file, raised before any decoder allocates."""
from __future__ import annotations

import os
import warnings

from PIL import Image, UnidentifiedImageError

from vitbench.core.files import special_file
from vitbench.errors import DataError

__all__ = ["MAX_PIXELS", "open_image"]

#: the most pixels an image may declare: Pillow's own decompression-bomb limit (2 x MAX_IMAGE_PIXELS)
MAX_PIXELS = 2 * 89_478_485


def open_image(path: str | os.PathLike[str], mode: str = "RGB") -> Image.Image:
    """The image at ``path`` decoded and converted to ``mode`` (``RGB`` or ``L``), as
    ``timm.data.ImageDataset`` reads it: no EXIF rotation."""
    kind = special_file(path)
    if kind is not None:
        raise DataError(f"cannot read image {path}: it is {kind}, not an image file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                if width * height > MAX_PIXELS:
                    raise DataError(f"cannot read image {path}: it declares {width} x {height} pixels, more than "
                                    f"the {MAX_PIXELS:,} vitbench decodes (a decompression bomb?); remove or shrink it")
                return img.convert(mode)
    except Image.DecompressionBombError as exc:  # Pillow refused it on its header already
        raise DataError(f"cannot read image {path}: {exc} (a decompression bomb?); remove or shrink it") from None
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise DataError(f"cannot read image {path}: {exc.strerror or exc}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(f"cannot read image {path}: it is corrupt or not an image; remove or replace it") from exc
