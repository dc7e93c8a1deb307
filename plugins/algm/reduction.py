"""The ``algm`` plugin's reduction code (its two merges and ``build``), imported when a run asks
for the method; its parameters and registration are :mod:`vitbench_plugins.algm`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vitbench.errors import ParamError
from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, TrainStage, bipartite_soft_matching, descending_order,
    max_merge,
)
from vitbench_plugins.algm import ALGMParams


def window_similarity(keys: torch.Tensor, grid: tuple[int, int], window: int) -> torch.Tensor:
    """The mean pairwise cosine similarity (self-pairs left out) of the patch keys ``[B, N, d]``
    (``N = rows * cols``, row-major) in each ``window x window`` window, ``[B, windows]`` row-major."""
    rows, cols = grid
    b, _, d = keys.shape
    unit = F.normalize(keys.float(), dim=-1).view(b, rows // window, window, cols // window, window, d)
    unit = unit.permute(0, 1, 3, 2, 4, 5).reshape(b, -1, window * window, d)
    sim = unit @ unit.transpose(-1, -2)
    k = window * window
    return (sim.sum(dim=(-1, -2)) - sim.diagonal(dim1=-2, dim2=-1).sum(-1)) / (k * (k - 1))


def window_assignment(merged: torch.Tensor, grid: tuple[int, int], window: int) -> tuple[torch.Tensor, int]:
    """Each patch's output token ``[B, N]`` when the windows marked in ``merged [B, windows]``
    (the same number in every image) each become one token: tokens in the order of their first
    patch (row-major), and how many there are."""
    rows, cols = grid
    b = merged.shape[0]
    n = rows * cols
    patch = torch.arange(n, device=merged.device)
    win = (patch // cols // window) * (cols // window) + (patch % cols) // window  # each patch's window
    first = torch.full((cols // window * (rows // window),), n, device=merged.device, dtype=torch.long)
    first = first.scatter_reduce(0, win, patch, reduce="amin")  # each window's first patch
    rep = torch.where(merged[:, win], first[win].expand(b, -1), patch.expand(b, -1))  # [B, N]
    stands = rep == patch
    index = stands.long().cumsum(dim=1) - 1
    return index.gather(1, rep), int(stands[0].sum())


def pairs_above(metric: torch.Tensor, prefix: int, threshold: float) -> int:
    """How many tokens ToMe's bipartite matching (:func:`~vitbench.engine.bipartite_soft_matching`'s
    split) finds a partner for at a similarity of at least ``threshold``: the fewest over the batch."""
    rest = F.normalize(metric[:, prefix:].float(), dim=-1)
    a_start = prefix % 2
    a, b = rest[:, a_start::2], rest[:, 1 - a_start::2]
    best = (a @ b.transpose(-1, -2)).amax(dim=-1)
    return int((best >= threshold).sum(dim=1).min())


class LocalMerge(Reducer):
    """Merge each ``window x window`` window of similar patches into one token (the local stage)."""

    needs = frozenset({"keys"})

    def __init__(self, threshold: float, window: int, grid: tuple[int, int]) -> None:
        rows, cols = grid
        if rows % window or cols % window:
            raise ParamError(f"algm.window={window} does not tile the model's {rows}x{cols} patch grid; give a "
                             f"window that divides both sides")
        self.threshold = threshold
        self.window = window
        self.grid = grid

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        rows, cols = self.grid
        if x.shape[1] - prefix != rows * cols:
            raise ParamError(f"algm's local merge needs the whole {rows}x{cols} patch grid; its block has "
                             f"{x.shape[1] - prefix} patch tokens (put local_block before any other reduction)")
        with torch.no_grad():
            sim = window_similarity(info.keys[:, prefix:], self.grid, self.window)
            count = int((sim >= self.threshold).sum(dim=1).min())
            if count == 0:
                return x
            chosen = descending_order(sim)[:, :count]
            merged = torch.zeros_like(sim, dtype=torch.bool).scatter_(1, chosen, True)
            assign, clusters = window_assignment(merged, self.grid, self.window)
        return state.cluster(x, assign, clusters)


class GlobalMerge(Reducer):
    """Merge every token whose best bipartite partner is similar enough into it (the global stage)."""

    needs = frozenset({"keys"})

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        with torch.no_grad():
            r = min(pairs_above(info.keys, prefix, self.threshold), max_merge(x.shape[1], prefix))
        if r <= 0:
            return x
        return state.merge(x, bipartite_soft_matching(info.keys, r, prefix))


def build(params: ALGMParams, info: ModelInfo) -> Reduction:
    global_block = info.depth // 2 - 1 if params.global_block is None else params.global_block
    if not params.local_block < global_block < info.depth:
        raise ParamError(f"algm.local_block={params.local_block} and global_block={global_block} must satisfy "
                         f"local_block < global_block < {info.depth} (the model's blocks)")
    global_threshold = params.threshold if params.global_threshold is None else params.global_threshold
    reducers: list[Reducer | None] = [None] * info.depth
    reducers[params.local_block] = LocalMerge(params.threshold, params.window, info.grid)
    reducers[global_block] = GlobalMerge(global_threshold)
    train = (TrainStage(name="finetune", epochs=params.epochs, optimizer="AdamW", lr=params.lr,
                        batch_size=params.batch_size, backbone=True),) if params.epochs > 0 else ()
    return Reduction(reducers, prop_attn=params.prop_attn, trace_source=params.trace_source, train=train)
