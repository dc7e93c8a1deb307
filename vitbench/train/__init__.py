"""The fine-tuning loop every learnable method uses (docs/architecture.md, "The fine-tuning loop").

A method declares :class:`~vitbench.catalog.TrainStage` s on its
:class:`~vitbench.catalog.Reduction`; :func:`~vitbench.train.stages.run_stages` runs them on the
mmengine ``Runner`` for every task, each task supplying its trainer and data (cls:
:mod:`vitbench.tasks.cls.finetune`, det/seg: :mod:`vitbench.tasks.dense.train`).
"""
import importlib
import warnings
from typing import Any

from vitbench.train.checkpoint import load_trained, save_trained
from vitbench.train.stages import FinetuneResult, trainable_parameters

__all__ = ["FinetuneResult", "load_trained", "save_trained", "trainable_parameters"]


def __getattr__(name: str) -> Any:
    """``finetune``, the cls task's trainer, which moved to :mod:`vitbench.tasks.cls.finetune`
    (a deprecation warning; by name: this layer imports no task)."""
    if name == "finetune":
        warnings.warn("vitbench.train.finetune moved to vitbench.tasks.cls.finetune.finetune; import it from there",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module("vitbench.tasks.cls.finetune").finetune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
