"""The engine: the tensor code that reduces tokens inside a timm model (docs/architecture.md,
"The layers"). It imports torch, numpy, :mod:`vitbench.errors` and the core's contract
(:mod:`vitbench.core.contract`) only: what it needs of a method or a family comes in as arguments."""
from __future__ import annotations

from typing import Any

from vitbench.engine.attention import AttnInfo
from vitbench.engine.block import ReducingBlock, reduction_context
from vitbench.engine.matching import Matching, bipartite_soft_matching, max_merge
from vitbench.engine.ordering import descending_order
from vitbench.engine.reducer import LiteMLAHooks, Reducer, TileUnmerge
from vitbench.engine.token_state import PrefixTokenError, TokenState
from vitbench.engine.unmerge import enable_source_tracing, last_state, unmerge
from vitbench.core.moved import moved_attribute

__all__ = [
    "AttnInfo", "ReducingBlock", "reduction_context", "Matching", "bipartite_soft_matching", "max_merge",
    "descending_order", "LiteMLAHooks", "PrefixTokenError", "Reducer", "TileUnmerge", "TokenState", "enable_source_tracing", "last_state",
    "unmerge",
]


def __getattr__(name: str) -> Any:
    if name == "apply":  # apply's old home: it looks the method up in the plugin host, a layer above

        globals()["apply"] = moved_attribute("vitbench.engine", "apply", "vitbench.host.apply")  # warned once
        return globals()["apply"]
    raise AttributeError(f"module 'vitbench.engine' has no attribute {name!r}")
