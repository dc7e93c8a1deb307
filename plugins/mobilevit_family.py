"""Built-in plugin: the MobileViT model-family adapter (its code: :mod:`vitbench.engine.families.mobilevit`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench.engine.families.mobilevit"


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="mobilevit",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_stage",
        merge_grid=f"{_CODE}:merge_grid",
        sequence_grids=f"{_CODE}:sequence_grids",
        model_patterns=("mobilevit_*",),
        model_modules=("mobilevit",),
        provides=frozenset({"token_steps", "grid_merges", "channels", "before_attention", "keys", "attn", "values",
                            "input", "tokens"}),
        description="timm MobileViT (ByobNet with MobileVitBlocks: mobilevit_xxs/xs/s); "
                    "token methods per MobileViT block, unmerged or grid-folded back to a map",
    ))
