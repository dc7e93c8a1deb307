"""The ``cls`` task's own ``vitbench run``/``sweep`` options (:attr:`vitbench.task.TaskInfo.options`;
the CLI refuses them with another ``--task``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.errors import ParamError
from vitbench.task import option

__all__ = ["ClsOptions", "check_img_size"]

#: the smallest input side ``--img-size`` takes
MIN_IMG_SIZE = 8


@dataclass(frozen=True)
class ClsOptions:
    """``--img-size``."""

    img_size: Optional[int] = option(
        "the input side in pixels, for a timm ViT/DeiT: its position embedding is resampled to the new patch "
        "grid and the images resized (default: the model's own)", metavar="PIXELS")


def check_img_size(size: object) -> Optional[int]:
    """``--img-size`` checked: ``None`` or an integer of at least :data:`MIN_IMG_SIZE` pixels."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < MIN_IMG_SIZE:
        raise ParamError(f"--img-size {size!r} is out of range; give the input side in pixels, an integer "
                         f">= {MIN_IMG_SIZE} (a multiple of the model's patch size)")
    return size
