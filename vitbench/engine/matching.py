"""Bipartite soft matching (ToMe, docs/methods.md, "ToMe") and the merge it defines.

Tokens after the ``prefix`` protected ones are split alternately by their absolute position:
set A = even positions, set B = odd positions. Every A token picks its most similar B token
(cosine similarity of the metric); the ``r`` A tokens with the highest similarity merge into
their partners (several may merge into one), the rest stay. Output order: prefix tokens, the
unmerged A tokens in their original order, then the B tokens.

Prefix tokens take no part at all, which is the spec's ``S[prefix rows] = -inf`` for the class
token, extended to every prefix token (a distillation or register token may be neither a source
nor a destination) so that prefix tokens stay first and untouched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from vitbench.engine import cpu_kernels
from vitbench.engine.ordering import descending_order
from vitbench.engine.rows import add_rows, take_rows


@dataclass(frozen=True)
class Matching:
    """The outcome of one bipartite matching, applicable to any ``[B, N, *]`` tensor."""

    prefix: int
    a_start: int
    unm_idx: torch.Tensor  # [B, |A| - r] indices into A, ascending
    src_idx: torch.Tensor  # [B, r] indices into A
    dst_idx: torch.Tensor  # [B, r] indices into B

    @property
    def r(self) -> int:
        return self.src_idx.shape[1]

    def merge(self, x: torch.Tensor, mode: str = "sum") -> torch.Tensor:
        """Merge ``x [B, N, C]``: A sources are reduced (``sum`` or ``mean``) into their B partners."""
        c = x.shape[-1]
        head, rest = x[:, : self.prefix], x[:, self.prefix :]
        a, b = rest[:, self.a_start :: 2], rest[:, 1 - self.a_start :: 2]
        unm = a.gather(1, self.unm_idx[..., None].expand(-1, -1, c))
        src = a.gather(1, self.src_idx[..., None].expand(-1, -1, c))
        b = b.scatter_reduce(1, self.dst_idx[..., None].expand(-1, -1, c), src, reduce=mode,
                             include_self=True)
        return torch.cat([head, unm, b], dim=1)


    def weighted_merge(self, x: torch.Tensor, size: torch.Tensor,
                       keep: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """ToMe's size-weighted average merge of ``x [B, N, C]`` with sizes ``size [B, N, 1]``:
        ``(x_new, size_new)``, equal (up to float rounding) to ``merge(cat([x * size, size]))``
        divided by its last channel, in the same layout.

        Written to touch ``x`` as few times as possible, because in half precision on a GPU the
        merge is memory-bound: the new sizes and the weights ``size / new size`` are
        worked out on the small ``[B, N]`` tensors first; then one concatenation lays ``x`` out
        as ``[prefix, unmerged A, B scaled by their weights]`` (the unmerged A tokens by one row
        gather, :func:`~vitbench.engine.rows.take_rows`), and the weighted sources are added into
        their destinations (:func:`~vitbench.engine.rows.add_rows`). The textbook form
        (``x * size``, concatenate the size channel, gather, ``scatter_reduce``, concatenate,
        divide) reads and writes the whole ``x`` about five times; this about twice.

        ``keep = (merge_rows [B] bool, index [B, N - r])``: images where ``merge_rows`` is False
        are not merged but keep the tokens at ``index`` (PPT's per-image choice between pooling
        and pruning, docs/methods.md, "PPT") -- the same single gather, their weights 1 and their
        sources' contributions 0, instead of a merge, a keep and a select over the whole ``x``.
        Every step is one operation on the whole batch, so that a small batch (batch 1 on a CPU:
        docs/measuring.md, "Batch 1 on a CPU") pays for few operations.
        """
        if keep is None and cpu_kernels.usable(x, size):  # one compiled loop (batch 1 on a CPU)
            return cpu_kernels.weighted_merge(x, size, self.prefix, self.a_start,
                                              (self.unm_idx, self.src_idx, self.dst_idx))
        p, a0 = self.prefix, self.a_start
        batch, n = x.shape[:2]
        s = size.reshape(batch, n)
        s_a, s_b = s[:, p + a0 :: 2], s[:, p + 1 - a0 :: 2]
        s_src = s_a.gather(1, self.src_idx)
        s_dst = s_b.scatter_add(1, self.dst_idx, s_src)  # [B, |B|]: the B tokens' new sizes
        w_b = s_b / s_dst
        w_src = s_src / s_dst.gather(1, self.dst_idx)
        size_new = torch.cat([s[:, :p], s_a.gather(1, self.unm_idx), s_dst], dim=1)
        unm_pos = self.unm_idx * 2 + (p + a0)  # positions in x
        n_unm = unm_pos.shape[1]
        if keep is None:  # [prefix, unmerged A, B scaled by its weights]: one copy of x
            out = torch.cat([x[:, :p], take_rows(x, unm_pos),
                             x[:, p + 1 - a0 :: 2] * _as(w_b[..., None], x.dtype)], dim=1)
        else:
            rows, index = keep
            b_pos = torch.arange(p + 1 - a0, n, 2, device=x.device).expand(batch, -1)
            order = torch.cat([torch.arange(p, device=x.device).expand(batch, p), unm_pos, b_pos], dim=1)
            order = torch.where(rows[:, None], order, index)
            w_b = torch.where(rows[:, None], w_b, torch.ones_like(w_b))
            w_src = w_src * rows[:, None].to(w_src.dtype)
            size_new = torch.where(rows[:, None], size_new, s.gather(1, index))
            out = take_rows(x, order)
            out[:, p + n_unm :].mul_(_as(w_b[..., None], out.dtype))  # a view, scaled in place
        src = take_rows(x, self.src_idx * 2 + (p + a0))
        src = src * _as(w_src[..., None], src.dtype)
        add_rows(out, self.dst_idx + (p + n_unm), src)
        return out, size_new[..., None]


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (itself when it already is)."""
    return t if t.dtype == dtype else t.to(dtype)


def max_merge(num_tokens: int, prefix: int) -> int:
    """The most tokens one matching can remove: ``(N - prefix) // 2`` (docs/methods.md, "ToMe")."""
    return max(num_tokens - prefix, 0) // 2


def bipartite_soft_matching(metric: torch.Tensor, r: int, prefix: int) -> Matching:
    """Match ``metric [B, N, d]`` (ToMe's head-averaged keys) to remove ``r`` tokens.

    ``r`` is capped at ``(N - prefix) // 2``. Runs under ``no_grad``: gradients flow through the
    merge, not through the choice of partners (docs/methods.md, "ToMe"). In inference on a CPU, one compiled loop
    (:mod:`vitbench.engine.cpu_kernels`).
    """
    r = min(r, max_merge(metric.shape[1], prefix))
    a_start = prefix % 2
    if cpu_kernels.usable(metric):  # one compiled loop (batch 1 on a CPU)
        found = cpu_kernels.match(metric, r, prefix)
        if found is not None:
            return Matching(prefix, a_start, *found)
    with torch.no_grad():
        rest = metric[:, prefix:]
        rest = rest / rest.norm(dim=-1, keepdim=True)
        a, b = rest[:, a_start::2], rest[:, 1 - a_start :: 2]
        scores = a @ b.transpose(-1, -2)
        node_max, node_idx = scores.max(dim=-1)
        order = descending_order(node_max)
        src_idx = order[:, :r]
        unm_idx = order[:, r:].sort(dim=-1).values
        dst_idx = node_idx.gather(1, src_idx)
    return Matching(prefix, a_start, unm_idx, src_idx, dst_idx)
