"""Which kernel PyTorch's fused attention chose in a forward: flash, memory-efficient, cuDNN or the
plain math, per call of ``F.scaled_dot_product_attention``, as PyTorch's dispatcher picks it for
the call's inputs (``torch._fused_sdp_choice``). A mask (ToMe's proportional attention adds
log-size bias) keeps flash attention out on a GPU, and fp32 keeps it out there too, so a method's
speed-up against the fused baseline depends on it (ToMe PRs #21, #33; "Representation Shift",
ICCV 2025). docs/measuring.md, "Which attention kernel ran".
"""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.measure.precision import DEFAULT_PRECISION, autocast

__all__ = ["sdpa_backends"]

_NAMES = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "memory-efficient", "CUDNN_ATTENTION": "cuDNN",
          "MATH": "math", "OVERRIDEABLE": "a backend's own", "ERROR": "none"}


def _choice(args: tuple, kwargs: dict) -> str:
    """The backend PyTorch picks for one call, with whether it carried a mask."""
    from torch.nn.attention import SDPBackend

    q, k, v = args[:3]
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    try:
        picked = SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=kwargs.get("dropout_p", 0.0),
                                                    is_causal=kwargs.get("is_causal", False),
                                                    scale=kwargs.get("scale")))
        name = _NAMES.get(picked.name, picked.name.lower())
    except (RuntimeError, ValueError, TypeError):  # a PyTorch without the query, or inputs it refuses
        name = "unknown"
    return f"{name} (with a mask)" if mask is not None else name


@contextlib.contextmanager
def _recording(calls: list[str]) -> Iterator[None]:
    original = F.scaled_dot_product_attention

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(_choice(args, kwargs))
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = recorded
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def sdpa_backends(model: nn.Module, images: torch.Tensor, precision: str = DEFAULT_PRECISION) -> str:
    """How ``model``'s fused attention ran in one forward of ``images`` (on the model's device, in
    ``precision``): ``flash in 12 calls``, ``math (with a mask) in 11 calls, flash in 1``, or
    ``no fused attention`` when it made no call."""
    calls: list[str] = []
    device = next(model.parameters()).device
    with _recording(calls), torch.inference_mode(), autocast(precision, device):
        model.eval()(images.to(device))
    if not calls:
        return "no fused attention"
    return ", ".join(f"{name} in {n} call{'s' if n != 1 else ''}" for name, n in Counter(calls).most_common())
