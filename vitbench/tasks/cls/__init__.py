"""The ``cls`` task: ImageNet-style classification with the mmengine/mmpretrain runners.

Public entry points (imported lazily; the OpenMMLab stack is heavy to import):
:func:`~vitbench.tasks.cls.models.load_model`,
:func:`~vitbench.tasks.cls.default_model.load_default_model`,
:func:`~vitbench.tasks.cls.data.resolve_cls_data`,
:func:`~vitbench.tasks.cls.evaluate.evaluate_cls`.
"""
from __future__ import annotations

__all__ = ["DEFAULT_MODEL", "DEFAULT_MODEL_TRAIN_LIMIT"]

#: the embedded default model (:mod:`vitbench.tasks.cls.default_model`): ``--model``'s default
DEFAULT_MODEL = "vitbench-fmnist-vit"
#: training images learnable methods fine-tune on with the embedded default model (``--train-limit``)
DEFAULT_MODEL_TRAIN_LIMIT = 10000
