"""MCTF: multi-criteria token fusion, training-free (Lee, Choi & Kim, "Multi-criteria Token
Fusion with One-step-ahead Attention for Efficient Vision Transformers", CVPR 2024, §3.2-3.3).

In every block, after the attention residual and before the MLP (docs/methods.md §0), ``r``
patch tokens are fused away (ToMe's schedule and cap, docs/methods.md §1):

1. **Attraction** (§3.2, Eq. 2): the product of one attraction per criterion, each raised to
   ``1/tau`` (a temperature: the larger ``tau``, the weaker the criterion; ``tau = 0`` switches
   the criterion off)::

       W(i, j) = W_sim(i, j)^(1/tau_sim) * W_info(i, j)^(1/tau_info) * W_size(i, j)^(1/tau_size)

   - similarity ``W_sim = (cos(x_i, x_j) + 1) / 2``, on the **tokens** ``x`` themselves (all
     ``C`` channels), as the paper writes it and the official code computes it -- not on the
     keys as ToMe does;
   - informativeness ``W_info = (1/a_i) (1/a_j)``, ``a_j`` the attention token ``j`` receives,
     averaged over heads and queries (``A.mean(heads).mean(queries)``): tokens that little
     attends to are attracted more;
   - size ``W_size = (1/s_i) (1/s_j)``, ``s`` the number of patches a token stands for:
     large tokens are attracted less.

   ``1/a`` and ``1/s`` are divided by their largest value over the image's patch tokens, as the
   official code does; that is one constant factor per image, which keeps the values in (0, 1]
   and changes no choice. Defaults: the paper's DeiT-S setting ``tau_sim=1, tau_info=20,
   tau_size=40`` (the official command line; its supplementary lists the exponents, i.e. the
   reciprocals ``1, 1/20, 1/40``, confirmed by the authors in mlvlab/MCTF issue #3).
2. **Bidirectional bipartite soft matching** (§3.2). The patch tokens are split alternately by
   position into set A (even absolute positions) and B (odd), as ToMe in vitbench
   (:mod:`vitbench.engine.matching`). Step 1 fuses ``r1 = r // 2`` tokens A -> B: every A token
   takes its most attracted B token, the ``r1`` A tokens with the highest attraction fuse into
   their partners. Step 2 fuses ``r2 = r - r1`` tokens B -> A: every B token (a step-1
   destination included) takes its most attracted A token among those left, and the ``r2`` best
   fuse into them. **Step 2 reuses the step-1 attraction** (transposed, restricted to the A
   tokens left) instead of recomputing it on the tokens step 1 fused -- what the official code
   does; in particular the size criterion does not see the step-1 fusions. With
   ``bidirectional=False`` all ``r`` go A -> B (ToMe's matching with MCTF's attraction). Ties
   keep the lower index first (stable sort). The matching runs without gradients.
3. **Attention-weighted fusion**: every group (a token and everything fused into it, step 1
   and step 2 chained) becomes ``sum_i a_i s_i x_i / sum_i a_i s_i`` over its members; sizes
   add up, and traced sources add up (:meth:`~vitbench.engine.TokenState.cluster`). The weights
   carry no gradient; gradients flow through the tokens.

Choices where the paper (or its setting) and this hook point differ:

- **One-step-ahead attention: the same attention map, the fusion half a block later.** The
  paper measures informativeness by the attention of the block the fused tokens enter next
  rather than of the block just run (§3.3). The official code (mlvlab/MCTF,
  ``models/modules/blocks.py``, ``one_step_ahead=1`` in every published script) does it at the
  start of block ``l``: it computes block ``l``'s attention probabilities on the incoming
  tokens (proportional attention included), fuses the tokens with them (informativeness and
  fusion weights), then runs block ``l``'s attention sub-layer on the fused tokens with that
  map merged (keys: the sum over each group; queries: the ``a s``-weighted mean of the
  members' rows; values from the fused tokens) and the MLP on the fused tokens. A reducer
  here runs after the attention residual of block ``l`` and sees the same map -- block ``l``'s
  attention on block ``l``'s input tokens -- so informativeness is the paper's; what differs
  is where the fusion happens: the tokens fused are ``x + attn(x)`` instead of ``x``, and block
  ``l``'s attention sub-layer runs on the unfused tokens with its exact attention (as in
  ToMe), so no merged attention map is needed; only the MLP and later blocks see the fused
  tokens. (The official ablation without one-step-ahead fuses after the MLP of block ``l``
  with block ``l``'s attention; this hook lies between the two.)
- **Schedule**: ``r`` per block as ToMe (an int, a per-block list, or ``(r, inflect)``),
  every block, capped at ``(N - prefix) // 2``. The official DeiT-S/DeiT-T setting fuses 16
  tokens at the start of blocks 1-11 (``--activate_layer [1,...,11]``, none in block 0) and also
  caps so that at least 10 tokens remain; the cap is not copied. Because a block's fusion here
  uses that block's attention, the official setting is ``r=[0] + [16] * 11`` (197 tokens in
  block 0, then 181 ... 21, as the official code; DeiT-S 2.66 GMACs against the official
  fvcore count of 2.60 G, which also runs attention @ V and the value and output projections
  on the fused tokens). The default ``r=16`` fuses in all 12 blocks (181 ... 21, 11; 2.31
  GMACs): more reduction than the paper's setting. The official "MCTF-Fast" fuses 35 % of
  the patch tokens at the start of blocks 3, 6, 9 (``r=0.35``); on DeiT-S that is
  ``r=[0, 0, 0, 68, 0, 0, 44, 0, 0, 29, 0, 0]`` here (2.81 GMACs; official count 2.76 G).
- **Prefix tokens** (cls, dist, registers) take no part at all: they are neither in A nor in B
  and are excluded from the normalisations (the official code puts the class token in A with
  a ``-inf`` row).
- **Output order**: prefix, the A tokens left (original order), then the B tokens not fused in
  step 2 (original order). The official code leaves the latter in the order of their step-2
  attraction; the order decides the next block's A/B split.
- **Token-reduction consistency** (§3.4) is a fine-tuning objective: not part of this
  training-free method.

Cost per reducing block: the full attention matrix (the block gives up the fused kernel;
``needs={"attn"}``) and the ``|A| x |B|`` similarity of the tokens, ``(N_p / 2)^2 C`` MACs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from vitbench.catalog import BudgetKnob, MethodSpec, ModelInfo, Reduction, patch_count
from vitbench.engine import AttnInfo, TokenState, max_merge
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench_plugins.tome import schedule as tome_schedule

Schedule = Union[int, list[int], tuple[int, float]]


@dataclass(frozen=True)
class MCTFParams:
    """``r``: tokens fused per block -- an int, a per-block list, or ``(r, inflect)`` (ToMe's
    schedule); ``tau_*``: the temperature of each criterion (``0`` switches it off);
    ``bidirectional``: fuse ``r // 2`` A -> B, then the rest B -> A; ``prop_attn``: proportional
    attention; ``trace_source``: keep the sources for unmerge."""

    r: Schedule = 16
    tau_sim: float = 1.0
    tau_info: float = 20.0
    tau_size: float = 40.0
    bidirectional: bool = True
    prop_attn: bool = True
    trace_source: bool = False

    def __post_init__(self) -> None:
        _check_r(self.r)
        for name in ("tau_sim", "tau_info", "tau_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ParamError(f"mctf.{name}={value!r} is out of range; it must be a finite number >= 0 "
                                 f"(0 switches the criterion off)")


def _check_r(r: Schedule) -> None:
    if isinstance(r, tuple):
        if len(r) != 2 or not isinstance(r[0], int) or isinstance(r[0], bool):
            raise ParamError(f"mctf.r={r!r}: a schedule is (r, inflect), e.g. (16, -0.5)")
        values = [r[0]]
    else:
        values = [r] if isinstance(r, int) else list(r)
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ParamError(f"mctf.r={r!r} is out of range; it must be an integer >= 0 "
                         f"(or a list of them, one per block, or (r, inflect))")


def schedule(r: Schedule, depth: int) -> list[int]:
    """Tokens fused in each of ``depth`` blocks (ToMe's schedule, docs/methods.md §1)."""
    if isinstance(r, list) and len(r) != depth:
        raise ParamError(f"mctf.r has {len(r)} entries; the model has {depth} blocks")
    return tome_schedule(r, depth)


@dataclass(frozen=True)
class Temperatures:
    """The three criteria's temperatures (``0``: criterion off)."""

    sim: float = 1.0
    info: float = 20.0
    size: float = 40.0


# -- the attraction (§3.2, Eq. 2) ---------------------------------------------------------------
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


# -- bidirectional bipartite soft matching (§3.2) ----------------------------------------------
def _best_edges(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row takes its best column; the ``k`` rows with the best edges fuse.
    Returns ``(sources [B, k], their columns [B, k], rows left [B, rows - k] ascending)``."""
    best, column = scores.max(dim=-1)
    order = best.argsort(dim=-1, descending=True, stable=True)
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


class MCTFReducer:
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


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="mctf",
        kind="merging",
        params=MCTFParams,
        build=build,
        families=("vit",),
        needs_attention_probs=True,
        # r tokens fused per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="MCTF: multi-criteria (similarity, informativeness, size) bidirectional token fusion, "
                    "r tokens per block (training-free)",
    ))
