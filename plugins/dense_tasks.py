"""The built-in dense tasks on mmdet detectors around the reduced backbone: ``det`` (SSDLite,
box mAP) and ``seg`` (Mask R-CNN, box and mask mAP). The tasks' code is :mod:`vitbench.tasks.det`;
this plugin only registers them, with their own command-line options
(:mod:`vitbench.tasks.det.options`), as a third-party task plugin would. Both run under
``--launcher pytorch|slurm`` (:mod:`vitbench.distributed`)."""
from __future__ import annotations

from vitbench.catalog import TaskSpec
from vitbench.hookspecs import hookimpl
from vitbench.tasks.det.options import add_dense_options
from vitbench.tasks.det.task import (
    DENSE_METRICS,
    DET_ACCURACY,
    SEG_ACCURACY,
    dense_counter,
    dense_setup,
    dense_workspace,
    run_dense,
)


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    common = dict(setup=dense_setup, workspace=dense_workspace, run=run_dense, gmacs_counter=dense_counter,
                  metrics=DENSE_METRICS, counts="backbone", control=True, options=add_dense_options,
                  distributed=True)
    register(TaskSpec(name="det", accuracy=DET_ACCURACY, **common,
                      description="object detection (mmdet SSDLite on the backbone): box mAP, AP50, AP75"))
    register(TaskSpec(name="seg", accuracy=SEG_ACCURACY, **common,
                      description="instance segmentation (mmdet Mask R-CNN + FPN): box and mask mAP"))
