"""Token rows taken and added by index: ``x[b, index[b, i]]`` as one ``index_select`` and
``out[b, index[b, i]] += src[b, i]`` as one ``index_add_``, over the flattened ``[B * N, ...]`` rows.

The same values as ``gather`` / ``scatter_add_`` with the index expanded over the channels, but
a row is copied as a block instead of element by element through a broadcast index, which on a
CPU is several times faster (docs/measuring.md, "Batch 1 on a CPU"). At batch 1 the index is
used as it is; above, it is offset into the flattened rows."""
from __future__ import annotations

import torch

__all__ = ["add_rows", "take_rows"]


def _flat_index(index: torch.Tensor, n: int) -> torch.Tensor:
    """``index [B, M]`` into rows of ``[B, n]`` as indices into the flattened ``[B * n]`` rows."""
    if index.shape[0] == 1:
        return index.reshape(-1)
    offsets = torch.arange(0, index.shape[0] * n, n, device=index.device)
    return (index + offsets[:, None]).reshape(-1)


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``[B, M, *]``: the rows ``x[b, index[b, i]]`` of ``x [B, N, *]`` (``index [B, M]``, int64)."""
    b, n = x.shape[:2]
    if b == 1:
        return x.index_select(1, index[0])
    rows = x.reshape(b * n, *x.shape[2:]).index_select(0, _flat_index(index, n))
    return rows.view(b, index.shape[1], *x.shape[2:])


def add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out[b, index[b, i]] += src[b, i]`` in place (``out [B, N, *]`` contiguous, ``index [B, M]``,
    ``src [B, M, *]``); returns ``out``. Rows named twice receive both."""
    b, n = out.shape[:2]
    if b == 1:
        return out.index_add_(1, index[0], src)
    flat = out.view(b * n, *out.shape[2:])
    flat.index_add_(0, _flat_index(index, n), src.reshape(b * index.shape[1], *src.shape[2:]))
    return out
