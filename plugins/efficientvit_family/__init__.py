"""Built-in plugin: the EfficientViT (MIT, timm ``EfficientVit``) model family (registration here, the
adapter in :mod:`.adapter`, DCS's LiteMLA reducer in :mod:`.channels`, grid merges in :mod:`.tokens`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench_plugins.efficientvit_family.adapter"

#: what the adapter hands a method (:data:`vitbench.core.capabilities.CAPABILITIES`); its ``patch`` checks the same set
PROVIDES = frozenset({"grid_merges", "channels"})


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="efficientvit",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_stage",
        channel_reducer="vitbench_plugins.efficientvit_family.channels:DCSLiteMLAReducer",
        merge_grid="vitbench.engine.grid_merge:scaled_merge_grid",  # a map is merged as MobileViT's
        sequence_grids="vitbench_plugins.efficientvit_family.tokens:sequence_grids",
        model_patterns=("efficientvit_b*",),
        model_modules=("efficientvit_mit",),
        provides=PROVIDES,
        description="timm EfficientVit (MIT EfficientViT-B): channel methods on its LiteMLA blocks, "
                    "grid merges (LTM) between each block's LiteMLA and MBConv",
    ))
