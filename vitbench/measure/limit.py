"""The *limit* of a token-reduction method's speed: what its token counts alone allow.

A method saves time only by running blocks on fewer tokens; scoring, matching, gathering and
scattering cost time on top. The limit runs the unpatched timm blocks on the method's own
token counts, cut where vitbench cuts them (between attention and MLP,
:class:`~vitbench.engine.block.ReducingBlock`), and drops tokens by slicing (a view: no
scoring, no matching, no gather). ``method speed-up / limit speed-up`` is then the share of
the possible speed-up a method's implementation keeps (the GPU benchmark,
``benchmarks/gpu_reduction.py``, reports it per precision).

With every count equal to the input's token count the limit *is* the unpatched model (the
same modules in the same order), which the tests check.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitbench.engine.block import reduction_context
from vitbench.errors import ParamError

__all__ = ["TokenCountLimit", "token_counts"]


def token_counts(reduced: nn.Module, images: torch.Tensor) -> list[int]:
    """The token count after each block's reduction (the MLP's token count) in one forward of
    the reduced model on ``images`` (the batch's counts: an input-dependent method keeps the
    largest count of the batch, as its padded batch does)."""
    ctx = reduction_context(reduced)
    if ctx is None:
        raise ParamError("token_counts() needs a model reduced with vitbench.apply(model, method)")
    was_training = reduced.training
    reduced.eval()
    try:
        with torch.inference_mode():
            reduced(images)
    finally:
        reduced.train(was_training)
    return list(ctx.token_counts)


class TokenCountLimit(nn.Module):
    """The unpatched timm ViT ``model`` run on ``counts`` tokens after each block's attention.

    ``counts[i]``: tokens the MLP of block ``i`` (and the attention of block ``i + 1``) runs on;
    each count must not exceed the previous one. The kept tokens are the first ``counts[i]``
    (prefix tokens first, as every vitbench method keeps them), so the class-token head sees
    the class token. Shares ``model``'s modules (no copy).
    """

    def __init__(self, model: nn.Module, counts: Sequence[int]) -> None:
        super().__init__()
        blocks = getattr(model, "blocks", None)
        if blocks is None or not hasattr(model, "patch_embed"):
            raise ParamError(f"TokenCountLimit needs a timm ViT (patch_embed and blocks); got {type(model).__name__}")
        counts = [int(c) for c in counts]
        if len(counts) != len(blocks):
            raise ParamError(f"TokenCountLimit needs one count per block: {len(blocks)} blocks, {len(counts)} counts")
        if any(c < 1 for c in counts) or any(b > a for a, b in zip(counts, counts[1:])):
            raise ParamError(f"token counts must be >= 1 and never grow from block to block; got {counts}")
        self.model = model
        self.counts = counts

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(images))))
        for blk, n in zip(m.blocks, self.counts):
            x = x + blk.drop_path1(blk.ls1(blk.attn(blk.norm1(x))))
            x = x[:, :n]  # the cut, as a view
            x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
        return m.forward_head(m.norm(x))
