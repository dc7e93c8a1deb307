"""The ``saint`` plugin's reduction code (its vote, rank and ``build``), imported when a run asks
for the method; its parameters and registration are :mod:`vitbench_plugins.saint`."""
from __future__ import annotations

from typing import Optional

import torch

from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, chosen_layers
from vitbench_plugins.saint import SaintParams


def first_half(depth: int) -> tuple[int, ...]:
    """The blocks SAINT drops in on a ViT: the first ``depth // 2`` (the paper's early stage)."""
    return tuple(range(depth // 2))


def kept_index(keys: torch.Tensor, prefix: int, threshold: float, k: int, gamma: float) -> Optional[torch.Tensor]:
    """The tokens SAINT keeps of ``keys [B, N, d]`` (Sec. 3): the prefix, the sources it does not
    drop (most redundant first, as ranked), then every destination; ``None`` when the batch votes
    to drop none."""
    patches = keys[:, prefix:]
    unit = patches / patches.norm(dim=-1, keepdim=True)
    sim = unit[:, ::2] @ unit[:, 1::2].transpose(-1, -2)  # sources x destinations
    edges = sim >= threshold
    votes = edges.sum(dim=-1)
    drop = int((votes >= k).float().sum(dim=-1).mean().item())  # one rate for the batch, as the official code
    if drop <= 0:
        return None
    close = (sim * edges).sum(dim=-1) / votes.clamp(min=1)
    rank = torch.where(votes > 0, votes * torch.exp(gamma * (close - threshold)), sim.sum(dim=-1) / sim.shape[-1])
    kept_sources = rank.argsort(dim=-1, descending=True)[:, drop:]
    batch, destinations = keys.shape[0], sim.shape[-1]
    arange = torch.arange(max(prefix, destinations), device=keys.device)
    return torch.cat([arange[:prefix].expand(batch, prefix), prefix + 2 * kept_sources,
                      (prefix + 1 + 2 * arange[:destinations]).expand(batch, destinations)], dim=1)


class SaintReducer(Reducer):
    """SAINT's drop in one block, on the head-averaged keys."""

    needs = frozenset({"keys"})

    def __init__(self, threshold: float, k: int, gamma: float) -> None:
        self.threshold, self.k, self.gamma = threshold, k, gamma

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        index = kept_index(info.keys, state.prefix, self.threshold, self.k, self.gamma)
        return x if index is None else state.keep(x, index)


def build(params: SaintParams, info: ModelInfo) -> Reduction:
    layers = chosen_layers("saint", params.layers, info.depth, default=first_half)
    reducers = [SaintReducer(params.threshold, params.k, params.gamma) if i in layers else None
                for i in range(info.depth)]
    return Reduction(reducers, prop_attn=False)  # a drop leaves every token of size 1
