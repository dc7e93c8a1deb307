"""The engine: (timm model, method, params) -> reduced model (docs/architecture.md, layer 4)."""
from vitbench.engine.apply import apply
from vitbench.engine.attention import AttnInfo
from vitbench.engine.block import ReducingBlock, reduction_context
from vitbench.engine.matching import Matching, bipartite_soft_matching, max_merge
from vitbench.engine.ordering import descending_order
from vitbench.engine.reducer import Reducer
from vitbench.engine.token_state import PrefixTokenError, TokenState
from vitbench.engine.unmerge import enable_source_tracing, last_state, unmerge

__all__ = [
    "apply", "AttnInfo", "ReducingBlock", "reduction_context", "Matching",
    "bipartite_soft_matching", "max_merge", "descending_order", "PrefixTokenError", "Reducer", "TokenState", "enable_source_tracing",
    "last_state", "unmerge",
]
