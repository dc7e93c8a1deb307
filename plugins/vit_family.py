"""Built-in plugin: the ViT/DeiT model-family adapter."""
from vitbench.engine.families.vit import SPEC
from vitbench.hookspecs import hookimpl


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(SPEC)
