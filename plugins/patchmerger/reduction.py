"""The ``patchmerger`` plugin's reduction code (its merger and ``build``), imported when a run asks
for the method; its parameters and registration are :mod:`vitbench_plugins.patchmerger`.
"""
from __future__ import annotations

import torch
from torch import nn

from vitbench.errors import ParamError
from vitbench.kit import AttnInfo, ModelInfo, Reducer, Reduction, TokenState, adamw_cosine
from vitbench_plugins.patchmerger import PatchMergerParams


class PatchMergerReducer(nn.Module, Reducer):
    """The PatchMerger layer (paper Sec. 2): ``M`` learned queries merge the patch tokens."""

    def __init__(self, dim: int, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.norm = nn.LayerNorm(dim)
        self.queries = nn.Parameter(torch.randn(tokens, dim) * dim ** -0.5)
        self.train(False)  # inference until model.train(): it is applied to eval models

    def extra_repr(self) -> str:
        return f"tokens={self.tokens}"

    def weights(self, patches: torch.Tensor) -> torch.Tensor:
        """``[B, M, N_p]``: output ``j``'s weights over the patch tokens ``[B, N_p, C]`` (each row sums to 1)."""
        scores = self.norm(patches) @ self.queries.to(patches.dtype).t()  # [B, N_p, M]
        return scores.transpose(1, 2).softmax(dim=-1)

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        p = state.prefix
        w = self.weights(x[:, p:])
        merged = w @ x[:, p:]
        # bookkeeping: each input's size and source are shared among the outputs in proportion
        # to its weights (columns normalised), so sizes still add up to the patch count
        share = w / w.sum(dim=1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
        size = state.sizes(x)
        state.size = torch.cat([size[:, :p], share @ size[:, p:]], dim=1)
        if state.source is not None:
            source = state.source
            state.source = torch.cat([source[:, :p], share.to(source.dtype) @ source[:, p:]], dim=1)
        return torch.cat([x[:, :p], merged], dim=1)


def build(params: PatchMergerParams, info: ModelInfo) -> Reduction:
    layer = info.depth // 2 - 1 if params.layer is None else params.layer
    if not 0 <= layer < info.depth:
        raise ParamError(f"patchmerger.layer={layer} is out of range; valid block indices for this model: "
                         f"0..{info.depth - 1}")
    if params.tokens > info.num_patches:
        raise ParamError(f"patchmerger.tokens={params.tokens} is out of range; this model has "
                         f"{info.num_patches} patch tokens, so it must be in 1..{info.num_patches}")
    reducers = [PatchMergerReducer(info.embed_dim, params.tokens) if i == layer else None for i in range(info.depth)]
    return Reduction(reducers, prop_attn=False, train=(adamw_cosine("merger", params),))
