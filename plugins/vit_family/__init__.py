"""Built-in plugin: the ViT/DeiT model family (registration here, the adapter in :mod:`.adapter`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench_plugins.vit_family.adapter"

#: what the adapter hands a method (:data:`vitbench.core.capabilities.CAPABILITIES`); its ``patch`` checks the same set
PROVIDES = frozenset({"token_steps", "grid_merges", "channels", "one_width", "patch_grid", "smaller_input",
                      "before_attention", "restores", "keys", "cls_attn", "attn", "values", "input", "tokens"})


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="vit",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_block",
        final_features=f"{_CODE}:final_features",
        merge_grid="vitbench.engine.grid_merge:square_merge_grid",
        model_patterns=("vit_*", "deit_*", "deit3_*"),
        model_modules=("vision_transformer", "vision_transformer_hybrid", "deit"),  # not Eva, RelPos
        # describe refuses attention pooling (siglip map heads) and blocks other than timm Block
        model_excludes=("*_siglip_[0-9]*", "*_map_*", "*_xp_*", "*_18x2_*", "*_rpn_*", "*pwee_*"),
        provides=PROVIDES,
        description="timm VisionTransformer: ViT, DeiT (incl. distilled), DeiT-III, register tokens",
    ))
