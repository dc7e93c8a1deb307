"""vitbench: benchmark token merging, token pruning and channel selection for vision transformers.

Library use is one line: ``vitbench.apply(model, "tome", r=13)`` returns the reduced timm model;
``vitbench.benchmark(methods=["tome"])`` runs a benchmark as ``vitbench run`` does (:mod:`vitbench.api`).
"""
from __future__ import annotations

__version__ = "0.1.0"

from vitbench.core.moved import install as _install_moved  # noqa: E402
from vitbench.errors import VitbenchError  # noqa: E402

_install_moved()  # the old module names (vitbench.plugins, vitbench.plan, ...) still import

__all__ = ["__version__", "apply", "benchmark", "sweep", "Results", "RunOptions", "Task", "VitbenchError"]

#: the Python API (:mod:`vitbench.api`), imported on first use so that ``import vitbench`` stays cheap
_LAZY = {"benchmark": "vitbench.api", "sweep": "vitbench.api", "Results": "vitbench.api",
         "RunOptions": "vitbench.core.options", "Task": "vitbench.task"}


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vitbench' has no attribute {name!r}")


def apply(model, method: str, params=None, /, **overrides):  # type: ignore[no-untyped-def]
    """Reduce ``model`` in place with ``method`` and return it: ``params`` the method's parameter
    dataclass, or keywords (see :func:`vitbench.host.apply.apply`)."""
    # torch: on first use; `import vitbench` stays light
    from vitbench.host.apply import apply as _apply

    return _apply(model, method, params, **overrides)
