"""The plugin-author kit: a tiny model and a conformance check for a method plugin.

A plugin package tests itself with::

    from vitbench.testing import check_method

    def test_my_method_conforms():
        check_method("my-method")

or through the pytest fixtures ``vitbench_tiny_vit`` and ``vitbench_check_method`` that this
package's pytest plugin (loaded automatically once vitbench is installed) provides.
"""
from vitbench.testing.conformance import (
    PREFIX_MODELS, ConformanceReport, check_method, check_prefix_tokens, tiny_deit_distilled, tiny_vit,
    tiny_vit_registers,
)

__all__ = ["PREFIX_MODELS", "ConformanceReport", "check_method", "check_prefix_tokens", "tiny_deit_distilled",
           "tiny_vit", "tiny_vit_registers"]
