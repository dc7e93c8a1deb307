"""PiToMe: spectrum-preserving token merging, training-free (Tran et al., *Accelerating
Transformers with Spectrum-Preserving Token Merging*, NeurIPS 2024; §3, the energy score and
Algorithm 1; docs/methods.md, PiToMe section).

In every block, after the attention residual and before the MLP (docs/methods.md §0), with the
block's keys averaged over heads as the metric ``k_i`` of each patch token (prefix tokens take
no part):

1. **Energy.** ``E_i = 1/N_p * sum_j f_m(cos(k_i, k_j))`` over the ``N_p`` patch tokens, with
   ``f_m(x) = x`` if ``x >= m``, else ``alpha * (exp(x - m) - 1)``. A token with many close
   neighbours (a large uniform region) has high energy; an isolated token low energy.
2. **Split.** The patch tokens are ordered by energy, highest first. The ``2r`` highest are the
   merge candidates, taken alternately into set A (1st, 3rd, ...) and set B (2nd, 4th, ...);
   the other ``N_p - 2r`` tokens are **protected**: never merged in this block.
3. **Merge.** Every A token merges into its most similar B token (cosine of the keys), all
   ``r`` of them (several may go to one B token), size-weighted as ToMe (docs/methods.md §1);
   sizes and sources add up. Proportional attention (``log(size)``) stays on (``prop_attn``).
4. **Margin.** ``m`` falls linearly with depth: ``m_l = margin - margin_decay * l / L`` for
   block ``l`` (0-indexed) of ``L``. The paper: ``m = 0.9 - 0.9 * l / L``, ``alpha = 1``.

Choices the paper leaves open (or where we follow the official code's behaviour, cited as fact,
no code used):

- **Budget.** The paper's knob is a keep ratio per block (``N_p`` times ``1 - ratio`` tokens
  merged in each block; the official code computes ``floor(N - N * ratio)`` in floating point,
  we ``floor(N * (1 - ratio))`` rounded to 9 decimals first, so an exact product is not lost:
  175 tokens at 0.68 merge 56 here, 55 there). vitbench's knob is ToMe's: ``r`` tokens merged
  in each block (an int or one int per block), capped at ``(N - prefix) // 2``, so
  ``--match-gmacs`` and the token schedules compare directly with ``tome``.
  :func:`ratio_schedule` turns a paper ratio into the per-block list
  (``r=ratio_schedule(0.9, 196, 12)``).
- **The energy function** (``energy``): ``"paper"`` is the equation above. The official code
  computes ``ELU(x - m, alpha)`` instead, i.e. ``x - m`` above the margin: ``"elu"``. Every
  official version since February 2024 uses an ELU of ``x - m`` (until 2024-11-05 divided by
  0.1 or 0.01); none we found uses ``x`` above the margin. The two forms differ above the
  margin by ``m`` per neighbour, so they can rank tokens differently.
- **The mean includes ``j = i``** (``f_m(1)``, the same for every token: it shifts all energies
  alike and never changes the ranking), over the patch tokens only; sizes do not weight it.
- **Block index.** ``l`` counts from 0 (the first block uses ``m = margin``), as the official
  code. The official timm/DeiT patch (github.com/hchautran/PiToMe, ``algo/pitome/patch/deit.py``)
  used ``0.9 - 0.9 * l / L`` (ours) up to 2024-11-30 and ``0.75 - 0.75 * l / L`` since
  (commit 8170492); ``0.9 - 0.8 * l / L`` stood only from 2024-03-30 to 2024-04-01.
- **What the official code does and we do not** (facts, checked at commit 550b5de): it runs an
  energy-ordered ToMe-style matching without a protected set (``pitome_bsm``: A/B alternate
  over *all* tokens by energy, the ``r`` best A-B edges merge) in the first ``ceil(L/2)``
  blocks and the protected-set algorithm above only in the rest; most versions from March to
  October 2024 ran plain ToMe matching in every block whose margin was ``>= 0.45`` and scaled
  the ELU argument by ``1/0.01``. Since 2024-12-01 it applies no proportional attention (the
  block calls the attention without sizes); before, ``prop_attn`` defaulted to True (ours).
  We run the protected-set algorithm of the paper in every block. With ``energy="elu"`` one
  block of ours equals the official ``pitome`` merge (non-BSM path) on the same input, up to
  the token order (checked on random tensors: the same merged tokens and sizes, within 3e-7).
- **Ties.** Equal energies keep the lower position first (stable sort); an A token equally
  similar to two B tokens goes to the one of higher energy.
- **Layout.** The surviving patch tokens (protected and B) keep their original relative order
  after the prefix; the official code lays them out as [protected by energy, B by energy].
  Nothing downstream depends on the order except the tie-break just above (attention, LayerNorm
  and MLP act on a set; the class-token readout and the size-weighted pool ignore it), so the
  logits agree (tested against a plain reference in the official layout).
- Energies and similarities are computed in fp32, without gradients (the choice is not
  differentiated; gradients flow through the merge, as ToMe).

Cost per block: the ``N_p x N_p`` similarity, ``N_p^2 d`` MACs (``d`` the head width), on top
of what merging saves; ToMe's bipartite similarity is a quarter of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch
import torch.nn.functional as F

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, TokenState, max_merge
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl

#: the energy functions (module docstring): the paper's equation, or the official code's ELU
ENERGIES = ("paper", "elu")


@dataclass(frozen=True)
class PiToMeParams:
    """``r``: tokens merged per block (an int, or one per block); ``margin``/``margin_decay``:
    block ``l`` of ``L`` uses the margin ``margin - margin_decay * l / L``; ``alpha``: the scale
    below the margin; ``energy``: ``"paper"`` or ``"elu"`` (the official code's form)."""

    r: Union[int, list[int]] = 16
    margin: float = 0.9
    margin_decay: float = 0.9
    alpha: float = 1.0
    energy: str = "paper"
    prop_attn: bool = True
    trace_source: bool = False

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"pitome.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")
        if not -1.0 <= self.margin <= 1.0:
            raise ParamError(f"pitome.margin={self.margin} is out of range; it must be in [-1, 1] "
                             f"(a cosine similarity)")
        low, high = self.margin - 1.0, self.margin + 1.0
        if not low <= self.margin_decay <= high:
            raise ParamError(f"pitome.margin_decay={self.margin_decay} is out of range; with "
                             f"margin={self.margin} it must be in [{low:g}, {high:g}], so that every "
                             f"block's margin stays in [-1, 1]")
        if not (math.isfinite(self.alpha) and self.alpha >= 0.0):
            raise ParamError(f"pitome.alpha={self.alpha} is out of range; it must be a finite number >= 0")
        if self.energy not in ENERGIES:
            raise ParamError(f"pitome.energy={self.energy!r} is out of range; it must be one of: "
                             f"{', '.join(ENERGIES)}")


def schedule(r: Union[int, list[int]], depth: int) -> list[int]:
    """Tokens to merge in each of ``depth`` blocks."""
    if isinstance(r, int):
        return [r] * depth
    if len(r) != depth:
        raise ParamError(f"pitome.r has {len(r)} entries; the model has {depth} blocks")
    return list(r)


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
        order = scores.argsort(dim=-1, descending=True, stable=True)
        a_idx, b_idx = order[:, : 2 * r : 2], order[:, 1 : 2 * r : 2]
        a_to_b = sim.gather(1, a_idx[..., None].expand(-1, -1, sim.shape[-1])).gather(
            2, b_idx[:, None, :].expand(-1, r, -1))  # [B, r, r]
        dst = b_idx.gather(1, a_to_b.argmax(dim=-1))
    return EnergyMatching(src=a_idx, dst=dst, protected=order[:, 2 * r :])


class PiToMeReducer:
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
                for r, m in zip(schedule(params.r, info.depth), margins)]
    return Reduction(reducers, prop_attn=params.prop_attn, trace_source=params.trace_source)


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="pitome",
        kind="merging",
        params=PiToMeParams,
        build=build,
        families=("vit", "swin"),
        # r tokens merged per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="PiToMe: energy-protected bipartite merging, r tokens merged per block (training-free)",
    ))
