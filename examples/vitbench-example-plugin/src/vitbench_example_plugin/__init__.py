"""random-drop: keep a seeded random subset of the patch tokens at a few blocks; and the
``agreement`` task (:mod:`vitbench_example_plugin.agreement`).

An example of a third-party vitbench method plugin, and a useful baseline: a pruning method
that does no better than random at choosing which tokens to drop is not choosing well.

At each block listed in ``layers`` (0-indexed), every image keeps ``ceil(keep * (N - prefix))``
of its patch tokens, chosen uniformly at random; prefix tokens (cls, dist, registers) are always
kept, first, and the kept patches stay in their original order. The choice is drawn from a
generator seeded with ``seed + block index``, so a reduced model is deterministic (the same
tokens for the same batch position in every forward) and two blocks do not drop alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction
from vitbench.engine import AttnInfo, Reducer, TokenState
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl

__version__ = "0.1.0"


@dataclass(frozen=True)
class RandomDropParams:
    """``keep``: fraction of patch tokens kept at each of ``layers``; ``seed``: the draw's seed."""

    keep: float = 0.5
    layers: tuple[int, ...] = (3, 6, 9)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"random-drop.keep={self.keep} is out of range; it must be in (0, 1]")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"random-drop.layers={list(self.layers)}: block indices are >= 0")
        if self.seed < 0:
            raise ParamError(f"random-drop.seed={self.seed} is out of range; it must be >= 0")


class RandomDropReducer(Reducer):
    """Keep a random ``keep`` fraction of the patch tokens of each image (a token step only: the
    other hooks of :class:`vitbench.engine.Reducer` keep their defaults)."""

    needs: frozenset[str] = frozenset()  # nothing from the attention: the fused kernel stays

    def __init__(self, keep: float, seed: int) -> None:
        self.keep_ratio = keep
        self.seed = seed

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        batch, patches = x.shape[0], x.shape[1] - prefix
        k = math.ceil(self.keep_ratio * patches)
        if k >= patches:
            return x
        generator = torch.Generator().manual_seed(self.seed)  # CPU draw: same on every device
        order = torch.rand(batch, patches, generator=generator).argsort(dim=-1)
        kept = order[:, :k].sort(dim=-1).values.to(x.device) + prefix
        head = torch.arange(prefix, device=x.device).expand(batch, prefix)
        return state.keep(x, torch.cat([head, kept], dim=1))


def build(params: RandomDropParams, info: ModelInfo) -> Reduction:
    """One reducer per listed block; the others only apply proportional attention."""
    for layer in params.layers:
        if layer >= info.depth:
            raise ParamError(f"random-drop.layers contains {layer}; valid block indices for this "
                             f"model: 0..{info.depth - 1}")
    reducers = [RandomDropReducer(params.keep, params.seed + i) if i in params.layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=True)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="random-drop",
        kind="pruning",
        params=RandomDropParams,
        build=build,
        families=("vit",),
        # the fraction of patch tokens kept at each listed block: --match-gmacs searches it
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="keep a seeded random subset of the patch tokens at listed blocks (baseline)",
    ))


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    from vitbench_example_plugin.agreement import AgreementTask  # the task's module: what a task plugin holds

    register(AgreementTask())
