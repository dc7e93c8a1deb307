"""norm-drop: at a few blocks, keep the patch tokens with the largest norm (the plugin tutorial)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitbench.kit import (
    AttnInfo, BudgetKnob, MethodSpec, ModelInfo, Range, Reducer, Reduction, TokenState, hookimpl, param,
)


@dataclass(frozen=True)
class NormDropParams:
    """``keep``: fraction of patch tokens kept at each of ``layers`` (0-indexed blocks)."""

    # param(default, meaning, range=...): `vitbench describe norm-drop` prints the meaning and the
    # range, and a value outside it is refused before anything runs
    keep: float = param(0.7, "fraction of patch tokens kept at each listed block", range=Range(0, 1, low_open=True))
    layers: tuple[int, ...] = param((3, 6, 9), "the blocks that drop tokens (0-based)", range=Range(0))


class NormDrop(Reducer):
    """Keep the ``keep`` fraction of patch tokens with the largest L2 norm, in their order."""

    needs: frozenset[str] = frozenset()  # nothing from the attention: the fused kernel stays

    def __init__(self, keep: float) -> None:
        self.keep = keep

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        p = state.prefix  # class (and distillation, register) tokens: always kept, first
        k = math.ceil(self.keep * (x.shape[1] - p))
        best = x[:, p:].norm(dim=-1).topk(k, dim=-1).indices.sort(dim=-1).values + p
        head = torch.arange(p, device=x.device).expand(x.shape[0], p)
        return state.keep(x, torch.cat([head, best], dim=1))  # sizes and sources follow


def build(params: NormDropParams, info: ModelInfo) -> Reduction:
    """One reducer per listed block, ``None`` elsewhere."""
    return Reduction([NormDrop(params.keep) if i in params.layers else None for i in range(info.depth)])


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="norm-drop",
        kind="pruning",
        params=NormDropParams,
        build=build,
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),  # for --match-gmacs
        description="keep the patch tokens with the largest norm at listed blocks",
    ))
