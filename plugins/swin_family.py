"""Built-in plugin: the Swin model-family adapter."""
from vitbench.engine.families.swin import SPEC
from vitbench.hookspecs import hookimpl


@hookimpl
def vitbench_register_families(register):  # type: ignore[no-untyped-def]
    register(SPEC)
