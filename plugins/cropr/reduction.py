"""The ``cropr`` plugin's reduction code (its selection modules, reducers and ``build``), imported
when a run asks for the method; its parameters and registration are :mod:`vitbench_plugins.cropr`,
which every command imports and which therefore imports no torch.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from timm.layers import Mlp, trunc_normal_, trunc_normal_tf_
from torch import nn

from vitbench.errors import ParamError
from vitbench.kit import (
    AttnInfo, ModelInfo, Reducer, Reduction, TokenState, adamw_cosine, reduction_context, top_tokens,
)
from vitbench_plugins.cropr import CroprParams

_AUX = "cropr_aux"  # training: each module's auxiliary logits ([B, classes]; per patch [B, P, classes]), in order


class SelectionModule(nn.Module):
    """The paper's Cropr module (Sec. 3): learned queries cross-attend to the tokens; a token's
    score is its attention logits summed over queries and heads. In training the attention's
    output, through an MLP, feeds an auxiliary classifier (LayerNorm and Linear): of the queries'
    mean (an image's class), or ``per_query`` of each query (a patch's class, the paper's
    segmentation heads)."""

    def __init__(self, dim: int, queries: int, heads: int, mlp_ratio: float, num_classes: int,
                 per_query: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.per_query = per_query
        self.queries = nn.Parameter(torch.empty(1, queries, dim))
        trunc_normal_tf_(self.queries, std=dim ** -0.5)
        self.proj = nn.Linear(dim, dim) if heads > 1 else nn.Identity()
        self.mlp_norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))
        trunc_normal_(self.head[1].weight, std=0.02)
        nn.init.zeros_(self.head[1].bias)

    def drop_training_parts(self) -> None:
        """Keep the queries, all the scorer uses; the aggregation and the auxiliary head go (the
        paper removes its heads after training), so a trained model counts the parameters it runs."""
        self.proj = self.mlp_norm = self.mlp = self.head = None

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, N]`` of the tokens ``x [B, N, C]``: ``x_n . sum_m q_m``, the summed logits
        (without projections, the sum over heads of ``q_mh . x_nh`` is one dot product)."""
        return x @ self.queries.sum(dim=1)[0].to(x.dtype)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training: the auxiliary logits ``[B, classes]`` (the queries' outputs averaged; ``per_query``:
        ``[B, queries, classes]``) and the scores ``[B, N]`` of ``x [B, N, C]``."""
        b, n, c = x.shape
        m, h = self.queries.shape[1], self.heads
        q = self.queries.reshape(1, m, h, c // h).transpose(1, 2)  # [1, h, M, d]
        kv = x.reshape(b, n, h, c // h).transpose(1, 2)  # [B, h, N, d]: no key or value projection
        logits = q @ kv.transpose(-2, -1)  # [B, h, M, N]
        out = (logits * (c // h) ** -0.5).softmax(dim=-1) @ kv  # [B, h, M, d]
        out = self.proj(out.transpose(1, 2).reshape(b, m, c))
        out = out + self.mlp(self.mlp_norm(out))
        return self.head(out if self.per_query else out.mean(dim=1)), logits.sum(dim=(1, 2))


class CroprReducer(nn.Module, Reducer):
    """One Cropr module before a block's attention: prune ``rate`` patch tokens by the module's
    scores, the kept ones in descending score; in training also record the auxiliary logits."""

    before_attention = True

    def __init__(self, rate: int, module: SelectionModule, stash: bool = False) -> None:
        super().__init__()
        self.rate = rate
        self.selection = module
        self.stash = stash  # last-layer fusion: the pruned tokens are kept aside for FusionReducer
        # inference until ``model.train()``: methods are applied to eval models (as DynamicViT)
        self.train(False)

    def extra_repr(self) -> str:
        return f"rate={self.rate}, stash={self.stash}"

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        p = state.prefix
        patches = x.shape[1] - p
        if self.training and self.selection.head is not None:
            aux, scores = self.selection(x.detach())  # the selection learns from its own loss only
            state.private.setdefault(_AUX, []).append(aux)
        else:
            scores = self.selection.scores(x)
        r = min(self.rate, patches - 1)  # at least one patch token stays
        if r <= 0:
            return x
        return state.keep(x, top_tokens(scores[:, p:], patches - r, p, order="score"), stash=self.stash)


class FusionReducer(Reducer):
    """Last-layer fusion (Sec. 3.3): before the last block's attention every pruned token rejoins
    at its position, so the last block and a dense head see the whole grid."""

    before_attention = True
    restores = True

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        return state.restore(x)


def module_rates(rate: int, depth: int, fusion: bool = False) -> list[int]:
    """Tokens pruned before each block: none before block 0, ``rate + 1`` before block 1, then
    ``rate`` -- a module after every block but the last (the paper's schedule without fusion) or,
    with ``fusion``, but the last two (the pruned tokens rejoin before the last block); none
    anywhere when ``rate`` is 0."""
    modules = depth - 2 if fusion else depth - 1
    if rate == 0 or modules < 1:
        return [0] * depth
    rates = [0, rate + 1] + [rate] * (modules - 1)
    return rates + [0] * (depth - len(rates))


def auxiliary_loss_of(params: CroprParams) -> Callable[..., Optional[torch.Tensor]]:
    """The train stage's ``extra_loss``: the sum of the modules' auxiliary cross-entropies
    (unweighted, as the paper adds them) of the last forward -- on the images' ``labels``, or with
    ``aux="patches"`` on each patch's class (``ctx.patch_labels``, which the dense tasks give) --
    also put into ``ctx.extras`` (detached) as ``"cropr_aux_loss"``; ``None`` when no module
    recorded logits."""

    def auxiliary_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        ctx = reduction_context(model)
        aux = ctx.state.private.get(_AUX) if ctx is not None and ctx.state is not None else None
        if not aux:
            return None
        if params.aux == "patches":
            if ctx.patch_labels is None:
                raise ParamError("cropr.aux=patches trains each module on the classes of the patches, which the "
                                 "det and seg tasks give on a plain ViT; on cls use cropr.aux=class")
            labels = ctx.patch_labels.reshape(-1)
            aux = [a.reshape(-1, a.shape[-1]) for a in aux]
        loss = torch.stack([F.cross_entropy(a, labels, label_smoothing=params.label_smoothing) for a in aux]).sum()
        ctx.extras["cropr_aux_loss"] = loss.detach()
        return loss

    return auxiliary_loss


def drop_auxiliary_heads(model: nn.Module) -> None:
    """The stage's ``after``: every selection module keeps its scorer only."""
    for module in model.modules():
        if isinstance(module, SelectionModule):
            module.drop_training_parts()


def build(params: CroprParams, info: ModelInfo) -> Reduction:
    if info.embed_dim % params.heads:
        raise ParamError(f"cropr.heads={params.heads} does not divide the model's width {info.embed_dim}; "
                         f"give a divisor of {info.embed_dim}")
    if info.num_classes <= 0:
        raise ParamError("cropr trains auxiliary classifiers and needs a model with a classification head "
                         "(num_classes > 0)")
    patches = params.aux == "patches"
    if patches and params.queries != 1:
        raise ParamError(f"cropr.queries={params.queries} with cropr.aux=patches: that mode has one query per "
                         f"patch ({info.grid[0] * info.grid[1]} here); leave cropr.queries at 1")
    queries, classes = (info.grid[0] * info.grid[1], info.num_classes + 1) if patches else \
        (params.queries, info.num_classes)  # patches: the background is one more class
    rates = module_rates(params.rate, info.depth, params.fusion)
    reducers: list[Optional[Reducer]] = [
        CroprReducer(r, SelectionModule(info.embed_dim, queries, params.heads, params.mlp_ratio, classes,
                                        per_query=patches), stash=params.fusion) if r > 0 else None
        for r in rates]
    if params.fusion and any(rates):
        reducers[-1] = FusionReducer()
    stage = adamw_cosine("finetune", params, backbone=True, lr_groups=(("reducer.", params.module_lr),),
                         label_smoothing=params.label_smoothing, extra_loss=auxiliary_loss_of(params),
                         after=(drop_auxiliary_heads,))
    return Reduction(reducers, prop_attn=False, train=(stage,))
