"""SAINT: similarity-aware token pruning, training-free (Jeddi et al., *Similarity-Aware Token
Pruning: Your VLM but Faster*, arXiv 2503.11549, 2025; Sec. 3, the ViT setting; docs/methods.md,
"SAINT").

In each of the first half of the blocks, after the attention residual, on the head-averaged keys
of the patch tokens: the patches are split alternately into sources and destinations (as ToMe's
bipartite split) and joined by an edge where their cosine similarity reaches ``threshold``. A
source with at least ``k`` edges votes to be dropped; the drop count ``r`` is the batch's mean
vote count (the official code's rule, so it depends on the batch). The ``r`` sources ranked most
redundant, ``edges * exp(gamma * (mean similarity over its edges - threshold))`` (a source with
no edge: its mean similarity to all destinations), are dropped, not merged.

Parameters: ``threshold``, ``k``, ``gamma``, ``layers``; the budget knob is ``threshold`` (higher:
fewer edges, fewer drops)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class SaintParams:
    """``threshold``: the cosine similarity an edge needs; ``k``: the edges a source needs to vote;
    ``gamma``: how sharply the rank favours close edges; ``layers``: the blocks that drop."""

    threshold: float = param(0.75, "the cosine similarity of keys that joins a source and a destination",
                             range=Range(-1.0, 1.0))
    k: int = param(5, "the edges a source needs to vote for dropping", range=Range(1))
    gamma: float = param(10.0, "the rank's sharpness: edges x exp(gamma x (mean similarity - threshold))",
                         range=Range(0.0))
    layers: Optional[tuple[int, ...]] = param(None, "blocks (0-indexed) that drop tokens; None: the first half "
                                              "((0, ..., 5) of 12)", range=Range(0))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="saint",
        kind="pruning",
        params=SaintParams,
        build="vitbench_plugins.saint.reduction:build",
        needs=frozenset({"token_steps", "keys"}),
        # a higher threshold joins fewer pairs, so fewer sources vote and fewer are dropped
        budget=BudgetKnob("threshold", larger_means="more", low=0.0, high=1.0),
        description="SAINT: drop the sources with the most similar destinations, a per-batch rate by vote "
                    "(training-free)",
    ))
