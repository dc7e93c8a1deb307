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

from dataclasses import dataclass
from typing import Optional, Union

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count


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

    r: Union[int, list[int]] = param(11, "tokens pruned per pruning block: one int, or one per block",
                                     range=Range(0), why="or a list of them, one per block")
    i_share: float = param(0.5, "share of r pruned by importance (I-stage); the rest by similarity (S-stage)",
                           range=Range(0, 1))
    iters: int = param(30, "Weighted PageRank iterations of the I-stage", range=Range(1))
    heads: str = param("eir", "how per-head importance combines: eir or mean", choices=HEAD_MODES)
    partition: str = param("sequential",
                           "how the kept tokens split into sources and targets: sequential or alternate",
                           choices=PARTITIONS)
    layers: Optional[tuple[int, ...]] = param(None, "the pruning blocks (0-based; None: all)", range=Range(0))
    init: str = param("cls", "the Weighted PageRank's starting scores: cls or uniform", choices=INITS)
    order: str = param("s_first", "order of the stages in a pruning block: s_first or i_first", choices=ORDERS)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="zero-tprune",
        kind="pruning",
        params=ZeroTPruneParams,
        build="vitbench_plugins.zero_tprune.reduction:build",
        needs=frozenset({"token_steps", "attn"}),
        # r tokens pruned per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="Zero-TPrune: prune r tokens per block, first by key similarity to more important "
                    "tokens, then by Weighted PageRank importance on the attention graph left (training-free)",
    ))
