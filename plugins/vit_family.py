"""Built-in plugin: the ViT/DeiT model-family adapter (its code: :mod:`vitbench.engine.families.vit`)."""
from vitbench.kit import FamilySpec, hookimpl

_CODE = "vitbench.engine.families.vit"


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(FamilySpec(
        name="vit",
        matches=f"{_CODE}:matches",
        describe=f"{_CODE}:describe",
        patch=f"{_CODE}:patch",
        feature_module=f"{_CODE}:last_block",
        final_features=f"{_CODE}:final_features",
        merge_grid=f"{_CODE}:merge_grid",
        model_patterns=("vit_*", "deit_*", "deit3_*"),
        model_modules=("vision_transformer", "vision_transformer_hybrid", "deit"),  # not Eva, RelPos
        # describe refuses attention pooling (siglip map heads) and blocks other than timm Block
        model_excludes=("*_siglip_[0-9]*", "*_map_*", "*_xp_*", "*_18x2_*", "*_rpn_*", "*pwee_*"),
        provides=frozenset({"token_steps", "grid_merges", "channels", "one_width", "patch_grid", "smaller_input",
                            "before_attention", "restores", "keys", "cls_attn", "attn", "values", "input", "tokens"}),
        description="timm VisionTransformer: ViT, DeiT (incl. distilled), DeiT-III, register tokens",
    ))
