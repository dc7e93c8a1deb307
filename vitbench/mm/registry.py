"""vitbench's mmengine registries: child registries with scope ``vitbench``.

pluggy owns vitbench's plugins and catalogs; these registries only let the OpenMMLab runners
build vitbench's few mm components, named with the scope prefix in configs
(``dict(type="vitbench.TimmLogits", ...)``). Their parents are mmengine's root registries, so
``vitbench.X`` resolves under both the mmpretrain (cls) and mmdet (det/seg) default scopes;
``vitbench`` is never the default scope itself. ``locations`` lets mmengine import the
registering modules on first lookup. docs/architecture.md, "plugin vs mm registries", says why."""
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
                  locations=["vitbench.mm.classifier", "vitbench.tasks.models",
                             "vitbench.tasks.dense.backbone"])
#: The embedded data sets and the image-folder data set.
DATASETS = Registry("dataset", parent=MMENGINE_DATASETS, scope=SCOPE,
                    locations=["vitbench.data.fashion_mnist", "vitbench.data.image_folder"])
#: Data transforms (the image folders' loader that names a corrupt image).
TRANSFORMS = Registry("transform", parent=MMENGINE_TRANSFORMS, scope=SCOPE, locations=["vitbench.data.image_folder"])
#: Evaluation metrics (none of vitbench's own yet; the cls task uses mmpretrain's Accuracy).
METRICS = Registry("metric", parent=MMENGINE_METRICS, scope=SCOPE, locations=[])
#: Runner hooks (progress printing; the reduction runner hook lives with the engine).
HOOKS = Registry("hook", parent=MMENGINE_HOOKS, scope=SCOPE, locations=["vitbench.mm.hooks"])

__all__ = ["DATASETS", "HOOKS", "METRICS", "MODELS", "SCOPE", "TRANSFORMS"]
