"""Built-in plugin: the EfficientViT (MIT, timm ``EfficientVit``) model-family adapter (its code:
:mod:`vitbench.engine.families.efficientvit`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench.engine.families.efficientvit"


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="efficientvit",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_stage",
        channel_reducer="vitbench.engine.families.efficientvit_channels:DCSLiteMLAReducer",
        merge_grid="vitbench.engine.families.mobilevit:merge_grid",  # a map is merged as MobileViT's
        sequence_grids="vitbench.engine.families.efficientvit_tokens:sequence_grids",
        model_patterns=("efficientvit_b*",),
        model_modules=("efficientvit_mit",),
        provides=frozenset({"grid_merges", "channels"}),
        description="timm EfficientVit (MIT EfficientViT-B): channel methods on its LiteMLA blocks, "
                    "grid merges (LTM) between each block's LiteMLA and MBConv",
    ))
