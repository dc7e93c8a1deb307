"""The ``dtem`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.dtem`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.errors import ParamError
from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, adamw_cosine, bipartite_soft_matching, max_merge, schedule,
)
from vitbench_plugins.dtem import DTEMParams

_ALIVE = "dtem_alive"  # training: tokens (prefix included) that still take part in matchings


def soft_top_r(scores: torch.Tensor, r: int, k2: int, tau1: float, tau2: float) -> torch.Tensor:
    """Soft grouping (Sec. 3): ``[B, |A|, |B|]`` soft assignments of the A tokens to the B tokens.

    Each A token keeps its ``k2`` most similar B tokens; ``r`` rounds of a softmax over all
    those edges (``scores / tau1 / tau2``), each round damping the rows it picked by
    ``log(1 - picked)``, add up to a relaxed top-``r`` of the edges; a row that took more than
    1 is scaled back to 1 (the scale not differentiated)."""
    eps = torch.finfo(torch.float32).eps
    scores = scores.float()
    top, idx = scores.topk(min(k2, scores.shape[-1]), dim=-1)
    logits = top / tau1
    b, na, k = logits.shape
    picked = torch.zeros_like(logits)
    for _ in range(r):
        step = F.softmax(logits.reshape(b, -1) / tau2, dim=-1).reshape(b, na, k)
        picked = picked + step
        logits = logits + torch.log((1.0 - step.sum(dim=-1, keepdim=True)).clamp_min(eps))
    picked = picked / ((picked.sum(dim=-1, keepdim=True).detach() - 1.0).clamp_min(0.0) + 1.0)
    return torch.zeros_like(scores).scatter_add(-1, idx, picked)


class DTEMReducer(nn.Module, Reducer):
    """One block's decoupled embedding and its merge: ToMe's at inference, soft in training."""

    def __init__(self, r: int, dim: int, feat_dim: int, head_dim: int, init: str,
                 k2: int, tau1: float, tau2: float) -> None:
        super().__init__()
        self.r, self.k2, self.tau1, self.tau2 = r, k2, tau1, tau2
        self.init = init
        self.head_dim = head_dim
        self.embed = nn.Linear(dim, feat_dim)
        if init == "keys":  # an offset from the keys: zero, so the untrained metric is ToMe's
            nn.init.zeros_(self.embed.weight)
            nn.init.zeros_(self.embed.bias)
        self.needs = frozenset({"input", "keys"} if init == "keys" else {"input"})
        self.train(False)  # inference until model.train(): it is applied to eval models

    def extra_repr(self) -> str:
        return f"r={self.r}, init={self.init}, k2={self.k2}, tau1={self.tau1}, tau2={self.tau2}"

    def metric(self, info: AttnInfo) -> torch.Tensor:
        """``[B, N, feat_dim]``: the embedding of the attention's input, never differentiated
        into the backbone; with ``init="keys"`` added to the head-averaged keys (zero-padded)."""
        inputs = getattr(info, "input", None)
        if inputs is None or (self.init == "keys" and info.keys is None):
            raise ValueError(f"dtem needs the block's attention input{' and keys' if self.init == 'keys' else ''}")
        out = self.embed(inputs.detach())
        if self.init == "keys":
            keys = info.keys.detach()
            out = out + F.pad(keys, (0, out.shape[-1] - keys.shape[-1]))
        return out

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        metric = self.metric(info)
        if self.training:
            return self._soft_merge(x, state, metric)
        if min(self.r, max_merge(x.shape[1], state.prefix)) <= 0:
            return x
        return state.merge(x, bipartite_soft_matching(metric, self.r, state.prefix))

    def _soft_merge(self, x: torch.Tensor, state: TokenState, metric: torch.Tensor) -> torch.Tensor:
        """Training (Sec. 3, soft merging): nothing is removed; sizes move from A tokens to B tokens."""
        p, n_all = state.prefix, x.shape[1]
        n = state.private.get(_ALIVE, n_all)
        r = min(self.r, max(n - p, 0) // 2)
        if r <= 0:
            return x
        unit = metric[:, p:n] / metric[:, p:n].norm(dim=-1, keepdim=True)
        assign = soft_top_r(unit[:, 0::2] @ unit[:, 1::2].transpose(-1, -2), r, self.k2, self.tau1, self.tau2)
        assign = assign.to(x.dtype)
        size = state.sizes(x)
        xa, xb = x[:, p:n:2], x[:, p + 1:n:2]
        wa, wb = size[:, p:n:2], size[:, p + 1:n:2]
        to_b = assign.transpose(-1, -2)  # [B, |B|, |A|]
        wb_new = wb + to_b @ wa
        xb_new = (wb * xb + to_b @ (wa * xa)) / wb_new
        kept = 1.0 - assign.sum(dim=-1, keepdim=True)  # share of each A token not given away
        floor = torch.finfo(x.dtype).eps  # log(size) must stay finite for the gradients
        kept = kept + (kept.clamp(floor, 1.0) - kept).detach()
        wa_new = wa * kept
        sizes = torch.cat([wa_new, wb_new], dim=1)
        order = sizes[..., 0].argsort(dim=1, descending=True, stable=True)

        def sort(t: torch.Tensor) -> torch.Tensor:
            return t.gather(1, order[..., None].expand(-1, -1, t.shape[-1]))

        if state.source is not None:
            src = state.source
            sa, sb = src[:, p:n:2], src[:, p + 1:n:2]
            mixed = torch.cat([sa * kept.to(src.dtype), sb + to_b.to(src.dtype) @ sa], dim=1)
            state.source = torch.cat([src[:, :p], sort(mixed), src[:, n:]], dim=1)
        state.size = torch.cat([size[:, :p], sort(sizes), size[:, n:]], dim=1)
        state.private[_ALIVE] = n - r
        return torch.cat([x[:, :p], sort(torch.cat([xa, xb_new], dim=1)), x[:, n:]], dim=1)


def feat_dim_of(params: DTEMParams, info: ModelInfo) -> int:
    """The embedding's width: ``feat_dim``, else the head width (twice it from width 1024 on)."""
    head_dim = info.embed_dim // info.num_heads
    if params.feat_dim is not None:
        return params.feat_dim
    return head_dim if info.embed_dim < 1024 else 2 * head_dim


def build(params: DTEMParams, info: ModelInfo) -> Reduction:
    if isinstance(params.r, list) and len(params.r) != info.depth:
        raise ParamError(f"dtem.r has {len(params.r)} entries; the model has {info.depth} blocks")
    head_dim = info.embed_dim // info.num_heads
    feat_dim = feat_dim_of(params, info)
    if params.init == "keys" and feat_dim < head_dim:
        raise ParamError(f"dtem.feat_dim={feat_dim} is out of range for init='keys'; it must be >= the head "
                         f"width {head_dim} (or use init='random')")
    reducers: list[Optional[DTEMReducer]] = [
        DTEMReducer(r, info.embed_dim, feat_dim, head_dim, params.init, params.k2, params.tau1, params.tau2)
        if r > 0 else None for r in schedule(params.r, info.depth)]
    return Reduction(reducers, prop_attn=True, trace_source=params.trace_source,
                     train=(adamw_cosine("embedding", params),))
