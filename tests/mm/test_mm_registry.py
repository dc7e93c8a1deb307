"""The vitbench registries: scoped names resolve from the mmpretrain and mmdet scopes."""
from __future__ import annotations

import pytest
from mmengine.registry import DATASETS, HOOKS, MODELS, DefaultScope

from vitbench.mm import registry


def test_child_registries_have_vitbench_scope() -> None:
    for reg in (registry.MODELS, registry.DATASETS, registry.TRANSFORMS, registry.METRICS, registry.HOOKS):
        assert reg.scope == "vitbench"
        assert reg.parent is not None and reg.parent.scope == "mmengine"


@pytest.mark.parametrize("scope", [None, "mmpretrain", "mmdet"])
def test_scoped_names_resolve_from_any_scope(scope: str | None) -> None:
    if scope == "mmdet":
        pytest.importorskip("mmdet.registry")
    import mmpretrain.registry  # noqa: F401

    with DefaultScope.overwrite_default_scope(scope):
        with MODELS.switch_scope_and_registry(scope) as models:
            assert models.get("vitbench.TimmLogits").__name__ == "TimmLogits"
        with DATASETS.switch_scope_and_registry(scope) as datasets:
            assert datasets.get("vitbench.OfflineFashionMNIST").__name__ == "OfflineFashionMNIST"
            assert datasets.get("vitbench.ClsImageFolder").__name__ == "ClsImageFolder"
        with HOOKS.switch_scope_and_registry(scope) as hooks:
            assert hooks.get("vitbench.ProgressHook").__name__ == "ProgressHook"
