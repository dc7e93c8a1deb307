"""The ``cls`` task: ImageNet-style classification with the mmengine/mmpretrain runners.

Public entry points (imported lazily; the OpenMMLab stack is heavy to import):
:func:`~vitbench.tasks.models.load_model` (any timm model or an embedded one),
:func:`~vitbench.tasks.cls.default_model.load_default_model`,
:func:`~vitbench.tasks.cls.data.resolve_cls_data`,
:func:`~vitbench.tasks.cls.evaluate.evaluate_cls`.
"""
from __future__ import annotations

from vitbench.tasks.embedded import (
    DEFAULT_MODEL, DEIT_MODEL, EMBEDDED_MODELS, EMBEDDED_TRAIN_LIMIT, ENV_DEFAULT_MODEL, LEGACY_MODEL,
)

__all__ = ["DEFAULT_MODEL", "DEIT_MODEL", "EMBEDDED_MODELS", "EMBEDDED_TRAIN_LIMIT", "ENV_DEFAULT_MODEL",
           "LEGACY_MODEL"]
