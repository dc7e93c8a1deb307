"""The compiled loops behind :mod:`vitbench.engine.cpu_kernels` (imported on first use: numba).

Each loop does what :func:`~vitbench.engine.matching.bipartite_soft_matching` and
:meth:`~vitbench.engine.matching.Matching.weighted_merge` do with tensor operations (ToMe,
Bolya et al. 2023, Sec. 3), in the same order of additions where the order shows in the result;
``cache=True`` keeps the machine code in ``__pycache__`` after the first compile.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def match(metric: np.ndarray, r: int, prefix: int) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """Bipartite soft matching of ``metric [B, N, d]`` (float32): ``(ok, unm [B, |A|-r], src [B, r],
    dst [B, r])``; ``ok`` is False when a row's norm is 0 or not finite (the tensor path decides)."""
    bsz, n, d = metric.shape
    a0 = prefix % 2
    rest = n - prefix
    na, nb = (rest - a0 + 1) // 2, (rest + a0) // 2
    unm = np.empty((bsz, na - r), np.int64)
    src = np.empty((bsz, r), np.int64)
    dst = np.empty((bsz, r), np.int64)
    unit = np.empty((rest, d), np.float32)
    b_cols = np.empty((d, nb), np.float32)
    scores = np.empty(nb, np.float32)
    node_max = np.empty(na, np.float32)
    node_idx = np.empty(na, np.int64)
    for b in range(bsz):
        for i in range(rest):  # each row over its norm (cosine similarity)
            total = np.float32(0.0)
            for t in range(d):
                total += metric[b, prefix + i, t] * metric[b, prefix + i, t]
            norm = np.float32(np.sqrt(total))
            if not (norm > 0 and np.isfinite(norm)):
                return False, unm, src, dst
            for t in range(d):
                unit[i, t] = metric[b, prefix + i, t] / norm
        for j in range(nb):  # set B as columns, so that a row's scores vectorise over B
            for t in range(d):
                b_cols[t, j] = unit[1 - a0 + 2 * j, t]
        for i in range(na):  # every A token's most similar B token (the first on ties)
            scores[:] = 0.0
            for t in range(d):
                v = unit[a0 + 2 * i, t]
                for j in range(nb):
                    scores[j] += v * b_cols[t, j]
            best, arg = scores[0], 0
            for j in range(1, nb):
                if scores[j] > best:
                    best, arg = scores[j], j
            node_max[i], node_idx[i] = best, arg
        order = np.argsort(-node_max, kind="mergesort")  # descending, stable
        src[b] = order[:r]
        unm[b] = np.sort(order[r:])
        for i in range(r):
            dst[b, i] = node_idx[order[i]]
    return True, unm, src, dst


@numba.njit(cache=True, nogil=True)
def weighted_merge(x: np.ndarray, size: np.ndarray, prefix: int, a_start: int, unm: np.ndarray,
                   src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Size-weighted merge of ``x [B, N, C]`` with sizes ``size [B, N, 1]`` (float32) by a matching:
    ``(x_new [B, N-r, C], size_new [B, N-r, 1])``, laid out ``[prefix, unmerged A, B]``."""
    bsz, n, c = x.shape
    r, n_unm = src.shape[1], unm.shape[1]
    p, a0 = prefix, a_start
    nb = (n - p + a0) // 2
    out = np.empty((bsz, n - r, c), np.float32)
    size_new = np.empty((bsz, n - r, 1), np.float32)
    s_dst = np.empty(nb, np.float32)
    first_b = p + n_unm
    for b in range(bsz):
        for j in range(nb):
            s_dst[j] = size[b, p + 1 - a0 + 2 * j, 0]
        for i in range(r):  # the B tokens' new sizes, sources added in order
            s_dst[dst[b, i]] += size[b, p + a0 + 2 * src[b, i], 0]
        for i in range(p):
            size_new[b, i, 0] = size[b, i, 0]
            out[b, i] = x[b, i]
        for i in range(n_unm):
            pos = p + a0 + 2 * unm[b, i]
            size_new[b, p + i, 0] = size[b, pos, 0]
            out[b, p + i] = x[b, pos]
        for j in range(nb):  # each B token scaled by its share of its new size
            pos = p + 1 - a0 + 2 * j
            w = size[b, pos, 0] / s_dst[j]
            size_new[b, first_b + j, 0] = s_dst[j]
            for t in range(c):
                out[b, first_b + j, t] = x[b, pos, t] * w
        for i in range(r):  # then each source's share added, in order
            pos = p + a0 + 2 * src[b, i]
            j = dst[b, i]
            w = size[b, pos, 0] / s_dst[j]
            for t in range(c):
                out[b, first_b + j, t] += x[b, pos, t] * w
    return out, size_new
