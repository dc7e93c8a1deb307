"""Built-in plugin: the MobileViT model family (registration here, the adapter in :mod:`.adapter`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench_plugins.mobilevit_family.adapter"

#: what the adapter hands a method (:data:`vitbench.core.capabilities.CAPABILITIES`); its ``patch`` checks the same set
PROVIDES = frozenset({"token_steps", "grid_merges", "channels", "before_attention", "keys", "attn", "values",
                      "input", "tokens"})


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="mobilevit",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_stage",
        merge_grid="vitbench.engine.grid_merge:scaled_merge_grid",
        sequence_grids=f"{_CODE}:sequence_grids",
        model_patterns=("mobilevit_*",),
        model_modules=("mobilevit",),
        provides=PROVIDES,
        description="timm MobileViT (ByobNet with MobileVitBlocks: mobilevit_xxs/xs/s); "
                    "token methods per MobileViT block, unmerged or grid-folded back to a map",
    ))
