"""Features of a block's or stage's output per image: what the IB metric and the IB bounds read
(docs/methods.md, "The IB loss"; :mod:`vitbench.measure.ib` re-exports them)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Optional

import torch
from torch import nn

from vitbench.engine.block import reduction_context

__all__ = ["block_output", "features_during", "module_features", "pooled_features", "token_features"]

_EPS = 1e-12


def token_features(tokens: torch.Tensor, prefix: int, size: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Size-weighted mean of the patch tokens ``tokens[:, prefix:]`` -> ``[B, C]``.

    ``size [B, N, 1]`` (``None``: all ones) counts how many patches each token stands for, so
    a merged model's feature is the mean over original patches; padded tokens have size 0.
    """
    patches = tokens[:, prefix:]
    if size is None:
        return patches.mean(dim=1)
    w = size[:, prefix:].to(patches.dtype)
    return (patches * w).sum(dim=1) / w.sum(dim=1).clamp_min(_EPS)


def pooled_features(out: torch.Tensor, prefix: int = 0, size: Optional[torch.Tensor] = None,
                    batch: Optional[int] = None, channels_last: bool = False) -> torch.Tensor:
    """``[B, C]`` per image of a block's or stage's output ``out``: a map's spatial mean
    (``[B, C, H, W]``, or ``[B, H, W, C]`` with ``channels_last``), else :func:`token_features`;
    a hybrid's ``batch * k`` token sequences of an image count as one sequence of its tokens."""
    if out.dim() == 4:
        return out.mean(dim=(1, 2)) if channels_last else out.mean(dim=(2, 3))
    if batch is not None and out.shape[0] != batch:
        out = out.reshape(batch, -1, out.shape[-1])
        size = size.reshape(batch, -1, 1) if size is not None else None
    return token_features(out, prefix, size)


def module_features(model: nn.Module, module: nn.Module, images: torch.Tensor,
                    channels_last: bool = False) -> torch.Tensor:
    """``[B, C]``: :func:`pooled_features` of what ``module`` outputs during ``model(images)``,
    with the token sizes and prefix of the forward's reduction context (a plain model: sizes
    one, its ``num_prefix_tokens``)."""
    out = block_output(model, module, images)
    ctx = reduction_context(model)
    size = ctx.state.size if ctx is not None and ctx.state is not None else None
    prefix = ctx.prefix if ctx is not None else int(getattr(model, "num_prefix_tokens", 0))
    return pooled_features(out, prefix, size, images.shape[0], channels_last)


@contextlib.contextmanager
def features_during(model: nn.Module, module: nn.Module, seen: Callable[[torch.Tensor, torch.Tensor], None],
                    channels_last: bool = False) -> Iterator[None]:
    """While the block runs, ``seen(features, images)`` after every forward of ``model``: the
    :func:`module_features` that forward made, beside its input images, so a pass that runs the
    model anyway (an evaluation) yields them without a second forward."""
    captured: dict[str, torch.Tensor] = {}

    def after(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if "out" not in captured:
            return  # the module did not run in this forward (nothing to pool)
        images = args[0]
        ctx = reduction_context(model)
        size = ctx.state.size if ctx is not None and ctx.state is not None else None
        prefix = ctx.prefix if ctx is not None else int(getattr(model, "num_prefix_tokens", 0))
        seen(pooled_features(captured.pop("out"), prefix, size, images.shape[0], channels_last), images)

    handles = [module.register_forward_hook(lambda mod, args, out: captured.__setitem__("out", out)),
               model.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def block_output(model: nn.Module, block: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """What ``block`` (a module of ``model``) outputs during ``model(images)``."""
    captured: dict[str, torch.Tensor] = {}
    handle = block.register_forward_hook(lambda mod, args, out: captured.__setitem__("out", out))
    try:
        model(images)
    finally:
        handle.remove()
    return captured["out"]
