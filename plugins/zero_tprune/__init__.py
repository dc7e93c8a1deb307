"""Zero-TPrune: zero-shot token pruning on the attention graph, training-free (Wang, Dedhia &
Jha, "Zero-TPrune: Zero-Shot Token Pruning through Leveraging of the Attention Graph in
Pre-Trained Transformers", CVPR 2024, Sec. 3; docs/methods.md, "Zero-TPrune").

Each pruning block (after the attention residual, docs/methods.md, "The hook point") removes ``r`` patch
tokens, capped as ToMe, in the paper's order I' -> S -> I: a one-step Weighted PageRank ranks
the patches (I'); the S-stage prunes the sources most similar (cosine of the keys) to a more
important target; the I-stage runs the Weighted PageRank ``s <- A^T s`` on the attention graph
of the tokens left and prunes the least important patches. Prefix tokens are never pruned.

Parameters: ``r`` (int or per-block list), ``i_share`` (the I-stage's share of ``r``),
``iters``, ``heads`` (``eir``/``mean``), ``partition`` (``sequential``/``alternate``), ``init``
(``cls``/``uniform``), ``order`` (``s_first``/``i_first``), ``layers``. docs/methods.md, "Zero-TPrune"
says which choices are the paper's and which are ours, and the sources used."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from vitbench.catalog import HELP, BudgetKnob, MethodSpec, patch_count
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


#: how the per-head importance scores are combined (module docstring, "Heads")
HEAD_MODES = ("eir", "mean")
#: how the surviving tokens are split into sources and targets (module docstring, "Partition")
PARTITIONS = ("sequential", "alternate")
#: the WPR's starting scores (module docstring, "Initialisation")
INITS = ("cls", "uniform")
#: the order of the stages in a pruning block (module docstring, "Order")
ORDERS = ("s_first", "i_first")


@dataclass(frozen=True)
class ZeroTPruneParams:
    """``r`` tokens pruned per pruning block (an int, or one value per block), ``i_share`` of
    them by importance and the rest by similarity; ``iters`` WPR iterations; ``heads``,
    ``partition``, ``init`` and ``order`` as in the module docstring; ``layers`` the pruning
    blocks (``None``: all)."""

    r: Union[int, list[int]] = field(default=11, metadata={HELP: (
        "tokens pruned per pruning block: one int, or one per block")})
    i_share: float = field(default=0.5, metadata={HELP: (
        "share of r pruned by importance (I-stage); the rest by similarity (S-stage)")})
    iters: int = field(default=30, metadata={HELP: "Weighted PageRank iterations of the I-stage"})
    heads: str = field(default="eir", metadata={HELP: "how per-head importance combines: eir or mean"})
    partition: str = field(default="sequential", metadata={HELP: (
        "how the kept tokens split into sources and targets: sequential or alternate")})
    layers: Optional[tuple[int, ...]] = field(default=None, metadata={HELP: "the pruning blocks (0-based; None: all)"})
    init: str = field(default="cls", metadata={HELP: "the Weighted PageRank's starting scores: cls or uniform"})
    order: str = field(default="s_first", metadata={HELP: "order of the stages in a pruning block: s_first or i_first"})

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"zero-tprune.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")
        if not 0.0 <= self.i_share <= 1.0:
            raise ParamError(f"zero-tprune.i_share={self.i_share} is out of range; it must be in [0, 1]")
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 1:
            raise ParamError(f"zero-tprune.iters={self.iters!r} is out of range; it must be an integer >= 1")
        if self.heads not in HEAD_MODES:
            raise ParamError(f"zero-tprune.heads={self.heads!r}; valid: {', '.join(HEAD_MODES)}")
        if self.partition not in PARTITIONS:
            raise ParamError(f"zero-tprune.partition={self.partition!r}; valid: {', '.join(PARTITIONS)}")
        if self.init not in INITS:
            raise ParamError(f"zero-tprune.init={self.init!r}; valid: {', '.join(INITS)}")
        if self.order not in ORDERS:
            raise ParamError(f"zero-tprune.order={self.order!r}; valid: {', '.join(ORDERS)}")
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            raise ParamError(f"zero-tprune.layers={list(self.layers)}: block indices are >= 0")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="zero-tprune",
        kind="pruning",
        params=ZeroTPruneParams,
        build="vitbench_plugins.zero_tprune.reduction:build",
        families=("vit",),
        needs_attention_probs=True,
        # r tokens pruned per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="Zero-TPrune: prune r tokens per block, first by key similarity to more important "
                    "tokens, then by Weighted PageRank importance on the attention graph left (training-free)",
    ))
