"""Built-in plugin: the Swin model family (registration here, the adapter in :mod:`.adapter`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench_plugins.swin_family.adapter"

#: what the adapter hands a method (:data:`vitbench.core.capabilities.CAPABILITIES`); its ``patch`` checks the same set
PROVIDES = frozenset({"token_steps", "grid_merges", "channels", "smaller_input", "keys", "received_attn"})


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="swin",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_stage",
        channels_last=True,
        merge_grid="vitbench.engine.grid_merge:square_merge_grid",  # a tile is merged as a short ViT sequence
        reduces_tiles=True,
        model_patterns=("swin_*", "swinv2_*_window*"),
        model_modules=("swin_transformer", "swin_transformer_v2"),
        provides=PROVIDES,
        description="timm Swin Transformer V1 and V2; token methods per map tile for the MLP (merged, then "
                    "unmerged after it), channel methods in the window attention and the MLP",
    ))
