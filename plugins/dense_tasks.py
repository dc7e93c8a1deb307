"""The built-in dense tasks on mmdet detectors around the reduced backbone: ``det`` (SSDLite,
box mAP) and ``seg`` (Mask R-CNN, box and mask mAP). The tasks' code is :mod:`vitbench.tasks.det`;
this plugin only registers them, with their own command-line options
(:class:`vitbench.tasks.det.options.DenseOptions`), as a third-party task plugin would. Both run under
``--launcher pytorch|slurm`` (:mod:`vitbench.distributed`)."""
from __future__ import annotations

from vitbench.hookspecs import hookimpl
from vitbench.tasks.det.task import DetTask, SegTask


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    register(DetTask())
    register(SegTask())
