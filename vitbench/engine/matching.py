"""Bipartite soft matching (ToMe, docs/methods.md §1) and the merge it defines.

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

import torch


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


def max_merge(num_tokens: int, prefix: int) -> int:
    """The most tokens one matching can remove: ``(N - prefix) // 2`` (docs/methods.md §1)."""
    return max(num_tokens - prefix, 0) // 2


def bipartite_soft_matching(metric: torch.Tensor, r: int, prefix: int) -> Matching:
    """Match ``metric [B, N, d]`` (ToMe's head-averaged keys) to remove ``r`` tokens.

    ``r`` is capped at ``(N - prefix) // 2``. Runs under ``no_grad``: gradients flow through the
    merge, not through the choice of partners (§1).
    """
    r = min(r, max_merge(metric.shape[1], prefix))
    a_start = prefix % 2
    with torch.no_grad():
        rest = metric[:, prefix:]
        rest = rest / rest.norm(dim=-1, keepdim=True)
        a, b = rest[:, a_start::2], rest[:, 1 - a_start :: 2]
        scores = a @ b.transpose(-1, -2)
        node_max, node_idx = scores.max(dim=-1)
        order = node_max.argsort(dim=-1, descending=True, stable=True)
        src_idx = order[:, :r]
        unm_idx = order[:, r:].sort(dim=-1).values
        dst_idx = node_idx.gather(1, src_idx)
    return Matching(prefix, a_start, unm_idx, src_idx, dst_idx)
