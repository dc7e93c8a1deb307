"""How long the dense tasks train by default, per data set: the baseline detector's epochs, the
dense fine-tuning's (the control's, and the fewest of a learnable method's last stage) and the
training images. ``--detector-epochs``, ``--finetune-epochs`` and ``--train-limit`` override it.

On the Fashion-MNIST scenes the backbones start pretrained and the set is 3,000 canvases, so the
default is the short protocol the project's reports use (docs/results.md, "On the Fashion-MNIST
scenes with a pretrained backbone"); the shapes set and a ``--data`` folder keep the long one.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from vitbench.tasks.dense.data import SCENES
from vitbench.tasks.dense.protocol import DENSE_EPOCHS

__all__ = ["DenseSchedule", "FULL_SCHEDULE", "SCHEDULES", "schedule_for"]


@dataclass(frozen=True)
class DenseSchedule:
    """The default training lengths of ``det`` and ``seg`` on one data set."""

    detector_epochs: Mapping[str, int]  # the baseline detector's training, per task
    finetune_epochs: Mapping[str, int]  # the control's, and the fewest of a method's last stage
    train_limit: Optional[int] = None  # the first N training images (None: all)


#: the shapes set's and a ``--data`` folder's: every training image, det 8 + 8 epochs, seg 4 + 4
FULL_SCHEDULE = DenseSchedule(MappingProxyType({"det": 8, "seg": 4}), DENSE_EPOCHS)
#: by data name (``spec.data``): the scenes' first 1,000 canvases, 4 detector epochs, 1 fine-tuning
SCHEDULES: Mapping[str, DenseSchedule] = MappingProxyType({
    SCENES: DenseSchedule(MappingProxyType({"det": 4, "seg": 4}), MappingProxyType({"det": 1, "seg": 1}),
                                   train_limit=1000),
})


def schedule_for(data: Optional[str]) -> DenseSchedule:
    """The default schedule of the data named ``data`` (an embedded set's name, else a folder)."""
    return SCHEDULES.get(data or "", FULL_SCHEDULE)
