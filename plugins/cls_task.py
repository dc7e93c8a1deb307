"""The built-in ``cls`` task: ImageNet-style classification with mmpretrain (top-1/top-5), the
embedded Fashion-MNIST ViT by default. The task's code is :class:`vitbench.tasks.cls.task.ClsTask`; this
plugin only registers it, as a third-party task plugin would."""
from __future__ import annotations

from vitbench.kit import hookimpl
from vitbench.tasks.cls.task import ClsTask


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    register(ClsTask())
