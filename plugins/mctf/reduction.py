"""The ``mctf`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.mctf`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from vitbench.errors import ParamError
from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, descending_order, max_merge
from vitbench.kit import schedule as tome_schedule
from vitbench_plugins.mctf import MCTFParams, Schedule


def schedule(r: Schedule, depth: int) -> list[int]:
    """Tokens fused in each of ``depth`` blocks (ToMe's schedule, docs/methods.md, "ToMe")."""
    if isinstance(r, list) and len(r) != depth:
        raise ParamError(f"mctf.r has {len(r)} entries; the model has {depth} blocks")
    return tome_schedule(r, depth)


@dataclass(frozen=True)
class Temperatures:
    """The three criteria's temperatures (``0``: criterion off)."""

    sim: float = 1.0
    info: float = 20.0
    size: float = 40.0


# -- the attraction (Sec. 3.2, Eq. 2) ---------------------------------------------------------------
def split_ab(t: torch.Tensor, a_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sets A and B of the patch tokens ``t [B, n, *]``: alternate positions, A from ``a_start``."""
    return t[:, a_start::2], t[:, 1 - a_start::2]


def received_attention(attn: torch.Tensor) -> torch.Tensor:
    """``a_j``: the attention each token receives, averaged over heads and queries: ``[B, N]``."""
    return attn.mean(dim=(1, 2))


def _tempered(w: torch.Tensor, tau: float) -> Optional[torch.Tensor]:
    """``w ** (1 / tau)``; ``None`` when the criterion is off (``tau == 0``)."""
    return None if tau == 0 else w.pow(1.0 / tau)


def _inverse_normalised(v: torch.Tensor) -> torch.Tensor:
    """``1 / v`` divided by its largest value per image (``v [B, n]``, positive)."""
    inv = 1.0 / v.clamp_min(torch.finfo(v.dtype).tiny)
    return inv / inv.amax(dim=1, keepdim=True)


def attraction(tokens: torch.Tensor, received: torch.Tensor, size: torch.Tensor, a_start: int,
               taus: Temperatures) -> torch.Tensor:
    """The multi-criteria attraction ``W [B, |A|, |B|]`` between the A and B patch tokens.

    ``tokens [B, n, C]``, ``received [B, n]`` (attention received), ``size [B, n]``: the patch
    tokens only (no prefix). Computed in fp32.
    """
    tokens, received, size = tokens.float(), received.float(), size.float()
    unit = tokens / tokens.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    a, b = split_ab(unit, a_start)
    terms = [_tempered(((a @ b.transpose(1, 2) + 1.0) / 2.0).clamp(0.0, 1.0), taus.sim)]
    for value, tau in ((received, taus.info), (size, taus.size)):
        inv_a, inv_b = split_ab(_inverse_normalised(value), a_start)
        terms.append(_tempered(inv_a[:, :, None] * inv_b[:, None, :], tau))
    scores = torch.ones(a.shape[0], a.shape[1], b.shape[1], device=tokens.device)
    for term in terms:
        if term is not None:
            scores = scores * term
    return scores


# -- bidirectional bipartite soft matching (Sec. 3.2) ----------------------------------------------
def _best_edges(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row takes its best column; the ``k`` rows with the best edges fuse.
    Returns ``(sources [B, k], their columns [B, k], rows left [B, rows - k] ascending)``."""
    best, column = scores.max(dim=-1)
    order = descending_order(best)
    sources = order[:, :k]
    return sources, column.gather(1, sources), order[:, k:].sort(dim=-1).values


def fusion_slots(scores: torch.Tensor, r: int, bidirectional: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Where every A and every B token ends up: ``(slot_a [B, |A|], slot_b [B, |B|])``, indices
    into the fused patch tokens, laid out as the A tokens left then the B tokens left (each in
    original order). ``scores [B, |A|, |B|]`` is the attraction; ``r`` tokens fuse, ``r // 2``
    A -> B then the rest B -> A (reusing ``scores``) when ``bidirectional``, else all A -> B."""
    batch, n_a, n_b = scores.shape
    r1 = r // 2 if bidirectional else r
    r2 = r - r1
    device = scores.device
    src_a, dst_b, kept_a = _best_edges(scores, r1)
    if r2 > 0:  # B -> the A tokens left, by the same attraction
        back = scores.gather(1, kept_a[..., None].expand(-1, -1, n_b)).transpose(1, 2)
        src_b, dst_a, kept_b = _best_edges(back, r2)  # dst_a: positions in kept_a = slots
    else:
        src_b = dst_a = torch.empty(batch, 0, dtype=torch.long, device=device)
        kept_b = torch.arange(n_b, device=device).expand(batch, -1)
    n_kept_a = n_a - r1
    slot_a = torch.empty(batch, n_a, dtype=torch.long, device=device)
    slot_b = torch.empty(batch, n_b, dtype=torch.long, device=device)
    slot_a.scatter_(1, kept_a, torch.arange(n_kept_a, device=device).expand(batch, -1))
    slot_b.scatter_(1, kept_b, torch.arange(n_kept_a, n_kept_a + n_b - r2, device=device).expand(batch, -1))
    slot_b.scatter_(1, src_b, dst_a)
    slot_a.scatter_(1, src_a, slot_b.gather(1, dst_b))  # step-1 sources follow their destination
    return slot_a, slot_b


def fusion_assignment(scores: torch.Tensor, r: int, bidirectional: bool, a_start: int,
                      patches: int) -> torch.Tensor:
    """Each patch token's fused token, ``[B, patches]`` in ``0 .. patches - r - 1``."""
    slot_a, slot_b = fusion_slots(scores, r, bidirectional)
    assign = torch.empty(scores.shape[0], patches, dtype=torch.long, device=scores.device)
    assign[:, a_start::2] = slot_a
    assign[:, 1 - a_start::2] = slot_b
    return assign


# -- attention-weighted fusion ------------------------------------------------------------------
def fuse(x: torch.Tensor, state: TokenState, assign: torch.Tensor, clusters: int,
         weight: torch.Tensor) -> torch.Tensor:
    """Fuse the patch tokens of ``x [B, N, C]`` into ``clusters`` tokens by ``assign``: each the
    mean of its members weighted by ``weight [B, N, 1]`` x size; sizes (and sources) add up.

    :meth:`TokenState.cluster` pools size-weighted means, so pooling ``[x * w, w]`` gives
    ``sum(w s x) / sum(s)`` and ``sum(w s) / sum(s)``, whose ratio is the weighted mean; the
    state keeps sizes and sources in step. The prefix tokens are returned unchanged.
    """
    c, p = x.shape[-1], state.prefix
    pooled = state.cluster(torch.cat([x * weight, weight], dim=-1), assign, clusters)
    return torch.cat([x[:, :p], pooled[:, p:, :c] / pooled[:, p:, c:]], dim=1)


class MCTFReducer(Reducer):
    """Fuse ``r`` tokens after a block's attention (module docstring)."""

    needs = frozenset({"attn"})

    def __init__(self, r: int, taus: Temperatures, bidirectional: bool) -> None:
        self.r = r
        self.taus = taus
        self.bidirectional = bidirectional

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        p = state.prefix
        r = min(self.r, max_merge(x.shape[1], p))
        if r <= 0:  # nothing left to fuse
            return x
        patches, a_start = x.shape[1] - p, p % 2
        with torch.no_grad():
            received = received_attention(info.attn).clamp_min(torch.finfo(info.attn.dtype).tiny)
            scores = attraction(x[:, p:], received[:, p:], state.sizes(x)[:, p:, 0], a_start, self.taus)
            assign = fusion_assignment(scores, r, self.bidirectional, a_start, patches)
        return fuse(x, state, assign, patches - r, received[..., None].to(x.dtype))


def build(params: MCTFParams, info: ModelInfo) -> Reduction:
    taus = Temperatures(params.tau_sim, params.tau_info, params.tau_size)
    reducers = [MCTFReducer(r, taus, params.bidirectional) if r > 0 else None
                for r in schedule(params.r, info.depth)]
    return Reduction(reducers, prop_attn=params.prop_attn, trace_source=params.trace_source)
