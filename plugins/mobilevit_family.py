"""Built-in plugin: the MobileViT model-family adapter."""
from vitbench.engine.families.mobilevit import SPEC
from vitbench.hookspecs import hookimpl


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(SPEC)
