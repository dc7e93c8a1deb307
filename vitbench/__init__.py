"""vitbench: benchmark token merging, token pruning and channel selection for vision transformers.

Library use is one line: ``vitbench.apply(model, "tome", r=13)`` returns the reduced timm model.
"""
from __future__ import annotations

__version__ = "0.1.0"

from vitbench.errors import VitbenchError  # noqa: E402

__all__ = ["__version__", "apply", "VitbenchError"]


def apply(model, method: str, **params):  # type: ignore[no-untyped-def]
    """Reduce ``model`` in place with ``method`` and return it (see :func:`vitbench.engine.apply.apply`)."""
    from vitbench.engine.apply import apply as _apply

    return _apply(model, method, **params)
