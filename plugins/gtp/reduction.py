"""The ``gtp`` plugin's reduction code (its graphs, reducer and ``build``), imported when a run asks
for the method; its parameters and registration are :mod:`vitbench_plugins.gtp`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from vitbench.errors import ParamError
from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, descending_order, schedule, take_rows
from vitbench_plugins.gtp import GTPParams

#: where the current graph travels through the blocks of one forward (``TokenState.private``)
GRAPH_KEY = "gtp_graph"


def spatial_graph(rows: int, cols: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """``[N, N]`` adjacency of a ``rows x cols`` patch grid: 1 between a patch and each of its
    (up to eight) neighbours, 0 on the diagonal (Sec. 3, the spatial graph)."""
    r = torch.arange(rows * cols, device=device) // cols
    c = torch.arange(rows * cols, device=device) % cols
    near = ((r[:, None] - r[None, :]).abs() <= 1) & ((c[:, None] - c[None, :]).abs() <= 1)
    return (near & ~torch.eye(rows * cols, dtype=torch.bool, device=device)).float()


def semantic_graph(tokens: torch.Tensor, neighbours: int) -> torch.Tensor:
    """``[B, N, N]`` adjacency linking each of the tokens ``[B, N, C]`` to its ``neighbours`` most
    cosine-similar other tokens (a directed k-nearest-neighbour graph; Sec. 3, the semantic graph)."""
    unit = F.normalize(tokens.float(), dim=-1)
    sim = unit @ unit.transpose(-1, -2)
    n = sim.shape[-1]
    sim = sim.masked_fill(torch.eye(n, dtype=torch.bool, device=sim.device), float("-inf"))
    nearest = descending_order(sim)[..., : min(neighbours, n - 1)]
    return torch.zeros_like(sim).scatter_(-1, nearest, 1.0)


def normalised(adjacency: torch.Tensor) -> torch.Tensor:
    """``D^-1/2 A D^-1/2`` with ``D`` the row sums of ``A`` (a token without an edge stays without)."""
    degree = adjacency.sum(-1)
    scale = torch.where(degree > 0, degree.clamp_min(1e-12).rsqrt(), torch.zeros_like(degree))
    return scale[..., :, None] * adjacency * scale[..., None, :]


def importance(attn: torch.Tensor, prefix: int) -> torch.Tensor:
    """Each patch token's importance ``[B, N - prefix]`` from the probabilities ``[B, h, N, N]``:
    the largest attention any head pays it from itself, times the largest attention any head
    pays it in total over the queries (the official ``MixedAttnMax``)."""
    own = attn.diagonal(dim1=-2, dim2=-1)[..., prefix:].amax(dim=1)
    received = attn[..., prefix:].sum(dim=-2).amax(dim=1)
    return own * received


class GTPReducer(Reducer):
    """Eliminate ``r`` patch tokens after one block's attention, propagating them to the kept ones."""

    def __init__(self, r: int, alpha: float, graph: str, neighbours: int, grid: tuple[int, int],
                 first: bool) -> None:
        self.r = r
        self.alpha = alpha
        self.graph = graph
        self.neighbours = neighbours
        self.grid = grid
        # the first block builds the graph, a semantic one from the tokens entering it; r = 0 only builds it
        needs = {"attn"} if r > 0 else set()
        self.needs = frozenset(needs | ({"tokens"} if first and graph != "spatial" else set()))

    def _start_graph(self, info: AttnInfo, prefix: int, x: torch.Tensor) -> torch.Tensor:
        batch, patches, device = x.shape[0], x.shape[1] - prefix, x.device
        adjacency = None
        if self.graph in ("spatial", "mixed"):
            rows, cols = self.grid
            if rows * cols != patches:
                raise ParamError(f"gtp graph={self.graph!r} needs the patch grid: the first reducing block "
                                 f"has {patches} patch tokens, the model's grid is {rows}x{cols}")
            adjacency = spatial_graph(rows, cols, device)[None].expand(batch, -1, -1)
        if self.graph in ("semantic", "mixed"):
            semantic = semantic_graph(info.tokens[:, prefix:], self.neighbours)
            adjacency = semantic if adjacency is None else torch.maximum(adjacency, semantic)
        return normalised(adjacency)

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        prefix = state.prefix
        patches = x.shape[1] - prefix
        graph = state.private.get(GRAPH_KEY)
        if graph is None:
            graph = self._start_graph(info, prefix, x)
        r = min(self.r, patches - 1)  # one patch token always stays
        if r <= 0:
            state.private[GRAPH_KEY] = graph
            return x
        with torch.no_grad():
            order = descending_order(importance(info.attn, prefix))
        kept = order[:, : patches - r].sort(dim=-1).values
        eliminated = order[:, patches - r :]
        to_eliminated = graph.gather(2, eliminated[:, None, :].expand(-1, patches, -1)).to(x.dtype)  # [B, Np, r]
        message = to_eliminated @ take_rows(x[:, prefix:], eliminated)  # [B, Np, C]
        x = torch.cat([x[:, :prefix], x[:, prefix:] + self.alpha * message], dim=1)
        rows = take_rows(graph, kept)
        state.private[GRAPH_KEY] = rows.gather(2, kept[:, None, :].expand(-1, kept.shape[1], -1))
        head = torch.arange(prefix, device=x.device).expand(x.shape[0], prefix)
        return state.keep(x, torch.cat([head, kept + prefix], dim=1))


def build(params: GTPParams, info: ModelInfo) -> Reduction:
    counts = schedule(params.r, info.depth, "gtp")
    # the graph comes from the tokens entering block 0 (the embeddings), as in the official code: a
    # semantic graph needs a step there even where block 0 eliminates nothing; a spatial one is
    # positional, so the first block that eliminates builds it
    first = 0 if params.graph != "spatial" else next((i for i, r in enumerate(counts) if r > 0), None)
    reducers = [GTPReducer(r, params.alpha, params.graph, params.neighbours, info.grid, first=i == first)
                if r > 0 or (i == first and any(counts)) else None for i, r in enumerate(counts)]
    # no proportional attention: an eliminated token's features are added, not averaged, so no
    # token stands for more patches (the official code's token scales are off by default)
    return Reduction(reducers, prop_attn=False, trace_source=params.trace_source)
