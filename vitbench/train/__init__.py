"""The fine-tuning loop every learnable method uses (docs/architecture.md, "The fine-tuning loop").

A method declares :class:`~vitbench.catalog.TrainStage` s on its
:class:`~vitbench.catalog.Reduction`; :func:`finetune` runs them on the mmengine ``Runner``.
"""
from vitbench.train.checkpoint import load_trained, save_trained
from vitbench.train.finetune import FinetuneResult, finetune, trainable_parameters

__all__ = ["FinetuneResult", "finetune", "load_trained", "save_trained", "trainable_parameters"]
