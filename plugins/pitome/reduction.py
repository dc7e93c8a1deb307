"""The ``pitome`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.pitome`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitbench.errors import ParamError
from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, descending_order, max_merge, schedule
from vitbench_plugins.pitome import PiToMeParams


def margin_schedule(margin: float, margin_decay: float, depth: int) -> list[float]:
    """The margin of each of ``depth`` blocks: ``margin - margin_decay * l / depth``, ``l`` from 0."""
    return [margin - margin_decay * layer / depth for layer in range(depth)]


def ratio_schedule(ratio: float, num_patches: int, depth: int) -> list[int]:
    """The paper's budget as vitbench's ``r``: each block merges ``floor(N * (1 - ratio))`` of
    the ``N`` patch tokens entering it (``N`` starts at ``num_patches``; capped at ``N // 2``)."""
    if not 0.0 < ratio <= 1.0:
        raise ParamError(f"pitome ratio={ratio} is out of range; it must be in (0, 1]")
    out, n = [], num_patches
    for _ in range(depth):
        r = min(math.floor(round(n * (1.0 - ratio), 9)), n // 2)
        out.append(r)
        n -= r
    return out


def energy_function(sim: torch.Tensor, margin: float, alpha: float, energy: str = "paper") -> torch.Tensor:
    """``f_m`` applied to cosine similarities: above the margin ``x`` (``"paper"``) or ``x - m``
    (``"elu"``); below it ``alpha * (exp(x - m) - 1)`` in both."""
    above = sim if energy == "paper" else sim - margin
    return torch.where(sim >= margin, above, alpha * torch.expm1(sim - margin))


def cosine_similarity(metric: torch.Tensor) -> torch.Tensor:
    """``cos(k_i, k_j)`` between the tokens of each image, ``[B, N, N]``, in fp32."""
    unit = F.normalize(metric.float(), dim=-1)
    return unit @ unit.transpose(-1, -2)


def energy_scores(metric: torch.Tensor, margin: float, alpha: float, energy: str = "paper") -> torch.Tensor:
    """``E_i = mean_j f_m(cos(k_i, k_j))`` of the tokens ``metric [B, N, d]`` (``j = i`` included)."""
    return energy_function(cosine_similarity(metric), margin, alpha, energy).mean(dim=-1)


@dataclass(frozen=True)
class EnergyMatching:
    """One block's PiToMe decision, positions counted among the patch tokens: the A tokens
    ``src [B, r]`` merge into the B tokens ``dst [B, r]``; ``protected [B, N - 2r]`` stay."""

    src: torch.Tensor
    dst: torch.Tensor
    protected: torch.Tensor

    def assignment(self, num_tokens: int) -> torch.Tensor:
        """Each patch token's output token ``[B, N]``: the survivors (protected and B) numbered
        in their original order, each A token sent to its destination's number."""
        b = self.src.shape[0]
        merged = torch.zeros(b, num_tokens, dtype=torch.bool, device=self.src.device)
        merged.scatter_(1, self.src, True)
        rank = (~merged).long().cumsum(dim=1) - 1
        return rank.scatter(1, self.src, rank.gather(1, self.dst))


def energy_matching(metric: torch.Tensor, r: int, margin: float, alpha: float,
                    energy: str = "paper") -> EnergyMatching:
    """PiToMe's ordered energy-based bipartite matching of ``metric [B, N, d]`` (patch tokens
    only) removing ``r`` tokens (capped at ``N // 2``)."""
    r = min(r, metric.shape[1] // 2)
    with torch.no_grad():
        sim = cosine_similarity(metric)
        scores = energy_function(sim, margin, alpha, energy).mean(dim=-1)
        order = descending_order(scores)
        a_idx, b_idx = order[:, : 2 * r : 2], order[:, 1 : 2 * r : 2]
        a_to_b = sim.gather(1, a_idx[..., None].expand(-1, -1, sim.shape[-1])).gather(
            2, b_idx[:, None, :].expand(-1, r, -1))  # [B, r, r]
        dst = b_idx.gather(1, a_to_b.argmax(dim=-1))
    return EnergyMatching(src=a_idx, dst=dst, protected=order[:, 2 * r :])


class PiToMeReducer(Reducer):
    """Merge ``r`` tokens after one block's attention, protecting the low-energy tokens."""

    needs = frozenset({"keys"})

    def __init__(self, r: int, margin: float, alpha: float, energy: str = "paper") -> None:
        self.r = r
        self.margin = margin
        self.alpha = alpha
        self.energy = energy

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        r = min(self.r, max_merge(x.shape[1], prefix))
        if r <= 0:  # nothing left to merge
            return x
        patches = x.shape[1] - prefix
        matching = energy_matching(info.keys[:, prefix:], r, self.margin, self.alpha, self.energy)
        return state.cluster(x, matching.assignment(patches), patches - r)


def build(params: PiToMeParams, info: ModelInfo) -> Reduction:
    margins = margin_schedule(params.margin, params.margin_decay, info.depth)
    reducers = [PiToMeReducer(r, m, params.alpha, params.energy) if r > 0 else None
                for r, m in zip(schedule(params.r, info.depth, "pitome"), margins)]
    return Reduction(reducers, prop_attn=params.prop_attn, trace_source=params.trace_source)
