"""The built-in dense tasks on mmdet detectors around the reduced backbone: ``det`` (SSDLite,
box mAP) and ``seg`` (Mask R-CNN, box and mask mAP). The tasks' code is :mod:`vitbench.tasks.dense`;
this plugin only registers them, with their own command-line options
(:class:`vitbench.tasks.dense.options.DenseOptions`), as a third-party task plugin would. Both run under
``--launcher pytorch|slurm`` (:mod:`vitbench.host.distributed`)."""
from __future__ import annotations

from vitbench.kit import hookimpl
from vitbench.tasks.det.task import DetTask
from vitbench.tasks.seg.task import SegTask


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    register(DetTask())
    register(SegTask())
