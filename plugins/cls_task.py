"""The built-in ``cls`` task: ImageNet-style classification with mmpretrain (top-1/top-5), the
embedded Fashion-MNIST ViT by default. The task's code is :mod:`vitbench.tasks.cls.run`; this
plugin only registers it, as a third-party task plugin would."""
from __future__ import annotations

from vitbench.catalog import TaskSpec
from vitbench.hookspecs import hookimpl
from vitbench.plan import METRICS
from vitbench.tasks.cls.run import (
    CLS_ACCURACY,
    cls_gmacs_counter,
    cls_setup,
    cls_shared_fields,
    cls_workspace,
    run_cls_spec,
)


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    register(TaskSpec(
        name="cls", setup=cls_setup, workspace=cls_workspace, run=run_cls_spec, gmacs_counter=cls_gmacs_counter,
        shared_fields=cls_shared_fields,
        metrics=METRICS, accuracy=CLS_ACCURACY, counts="model", distributed=True,
        description="image classification (mmpretrain ImageClassifier): top-1/top-5 accuracy",
    ))
