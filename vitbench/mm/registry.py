"""vitbench's mmengine registries: child registries with scope ``vitbench``.

pluggy owns vitbench's plugins and catalogs; these registries only let the OpenMMLab runners
build vitbench's few mm components (docs/architecture.md, "plugin vs mm registries"). Config
dicts name them with the scope prefix, e.g. ``dict(type="vitbench.TimmLogits", ...)``, and the
runners run under ``default_scope="mmpretrain"`` (cls) or ``"mmdet"`` (det/seg).

Why the parents are mmengine's root registries and not mmpretrain's: mmengine resolves a
scoped name ``"vitbench.X"`` from another scope only if ``vitbench`` is a child of that scope's
registry or of the root (``Registry.get``). As a child of mmpretrain's registries, ``vitbench.X``
would be reachable from mmpretrain's scope but not from mmdet's, and the det/seg tasks share
the backbone wrapper and the reduction runner hook. Under the root it is reachable from both.
Consequence: an unscoped name looked up in these registries falls back to mmengine's own
modules only, so configs always spell foreign types with their scope
(``"mmpretrain.ClsHead"``), which also keeps them correct under any current default scope.

Why ``vitbench`` is never the *default* scope: mmengine then imports ``vitbench.registry`` and
searches every registry tree (loops, visualizers, optimizers, ...) for a ``vitbench`` child,
logging a warning for each one it lacks.

``locations`` lists the modules that register into each registry; mmengine imports them the
first time a ``vitbench.*`` name is looked up, so a config needs no ``custom_imports``.
"""
from __future__ import annotations

# (the vitbench.mm package applies the compat fixes before this module runs)
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

SCOPE = "vitbench"

#: Backbone wrappers (the timm model inside an mm classifier/detector).
MODELS = Registry("model", parent=MMENGINE_MODELS, scope=SCOPE,
                  locations=["vitbench.mm.classifier", "vitbench.tasks.cls.models",
                             "vitbench.tasks.det.backbone"])
#: The embedded data sets and the image-folder data set.
DATASETS = Registry("dataset", parent=MMENGINE_DATASETS, scope=SCOPE,
                    locations=["vitbench.data.fashion_mnist", "vitbench.data.image_folder"])
#: Data transforms (none of vitbench's own yet; here so det/seg can add theirs).
TRANSFORMS = Registry("transform", parent=MMENGINE_TRANSFORMS, scope=SCOPE, locations=[])
#: Evaluation metrics (none of vitbench's own yet; the cls task uses mmpretrain's Accuracy).
METRICS = Registry("metric", parent=MMENGINE_METRICS, scope=SCOPE, locations=[])
#: Runner hooks (progress printing; the reduction runner hook lives with the engine).
HOOKS = Registry("hook", parent=MMENGINE_HOOKS, scope=SCOPE, locations=["vitbench.mm.hooks"])

__all__ = ["DATASETS", "HOOKS", "METRICS", "MODELS", "SCOPE", "TRANSFORMS"]
