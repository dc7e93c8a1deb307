"""Built-in plugin: the EfficientViT (MIT, timm ``EfficientVit``) model-family adapter."""
from vitbench.engine.families.efficientvit import SPEC
from vitbench.hookspecs import hookimpl


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(SPEC)
