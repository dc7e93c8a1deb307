"""GMACs of one forward pass, counted on the real forward at batch 1 (docs/measuring.md, "GMACs").

``torch.utils.flop_counter.FlopCounterMode`` sees every aten op the forward runs, so shrinking
token counts and input-dependent methods are counted as they run (per image, mean and spread
reported); ``gmacs = flops / 2 / 1e9``, the papers' "GFLOPs". The stock counter has no formula
for the CPU fused attention kernel, so :func:`attention_flop_formulas` supplies it through
``custom_mapping`` and fused and unfused attention count the same."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from vitbench.core import progress
from vitbench.errors import ParamError
from vitbench.core.guards import check_finite, check_metrics
from vitbench.measure._common import (
    check_input_size,
    check_int,
    check_model,
    eval_mode,
    model_device_dtype,
    random_images,
)

__all__ = ["GmacsResult", "attention_flop_formulas", "count_gmacs", "count_gmacs_at"]


@dataclass(frozen=True)
class GmacsResult:
    """GMACs per image of one forward: mean and sample standard deviation over ``n`` images.

    ``std`` is 0.0 for a fixed-cost model (and for ``n == 1``); input-dependent methods vary
    per image, and docs/measuring.md asks for that spread to be reported.
    """

    mean: float
    std: float
    n: int


# --- attention formulas --------------------------------------------------------------------
# Formulas take shapes (FlopCounterMode wraps custom formulas so tensors arrive as their
# shapes) and return FLOPs (2 per multiply-accumulate), like torch's own registry.


def _sdpa_flops(
    query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, *args: Any,
    out_shape: Any = None, **kwargs: Any,
) -> int:
    """FLOPs of ``softmax(Q K^T) V`` for any SDPA kernel: the two matmuls, as unfused ``bmm``.

    ``Q`` is ``[..., N, d]`` and ``K``/``V`` are ``[..., N_k, d]`` / ``[..., N_k, d_v]``:
    ``B*h*N*N_k*d`` MACs for ``QK^T`` plus ``B*h*N*N_k*d_v`` for ``A·V`` (``2*B*h*N*N_k*d`` when
    ``d_v == d``). ``B*h`` is taken from the query, so grouped-query attention (fewer K/V heads)
    counts every query head, as torch's formula for the CUDA kernels does. Softmax, scaling and
    masking are not counted, as for the unfused path; causal masking is not discounted (torch
    does not either, and ViTs do not use it).
    """
    batch_heads = math.prod(query_shape[:-2])
    n_q, d_qk = query_shape[-2], query_shape[-1]
    n_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * batch_heads * n_q * n_k * (d_qk + d_v)


def _native_mha_flops(
    query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, embed_dim: int,
    num_head: int, *args: Any, out_shape: Any = None, **kwargs: Any,
) -> int:
    """FLOPs of ``aten._native_multi_head_attention`` (``nn.MultiheadAttention``'s eval fast path).

    The fast path fuses projections and attention into one op the stock counter drops whole.
    Counted like the slow path: Q/K/V projections, ``QK^T`` and ``A·V`` (heads x head_dim =
    ``embed_dim``), the output projection; biases, softmax and masking are not counted.
    """
    batch = math.prod(query_shape[:-2])
    n_q, n_k, e = query_shape[-2], key_shape[-2], embed_dim
    macs = batch * (n_q * e * e + 2 * n_k * e * e + 2 * n_q * n_k * e + n_q * e * e)
    return 2 * macs


def _transformer_encoder_layer_flops(
    src_shape: torch.Size, embed_dim: int, num_heads: int, qkv_weight_shape: torch.Size,
    qkv_bias_shape: torch.Size, proj_weight_shape: torch.Size, proj_bias_shape: torch.Size,
    use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Size,
    norm_bias_1: torch.Size, norm_weight_2: torch.Size, norm_bias_2: torch.Size,
    ffn_weight_1_shape: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any,
) -> int:
    """FLOPs of ``aten._transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer`` fast path).

    Self-attention as in :func:`_native_mha_flops` plus the two feed-forward linears
    (``ffn_weight_1`` is ``[F, E]``); norms and activations are not counted, as for the slow path.
    """
    batch = math.prod(src_shape[:-2])
    n, e, f = src_shape[-2], embed_dim, ffn_weight_1_shape[0]
    macs = batch * (4 * n * e * e + 2 * n * n * e + 2 * n * e * f)
    return 2 * macs


# aten op name -> formula. Every fused attention kernel that SDPA (or nn.MultiheadAttention's
# fast path) can dispatch to in inference. Not listed: ``_scaled_dot_product_attention_math``,
# which the counter decomposes into the ``bmm`` ops it counts (same total), and the
# ``*_backward`` kernels (counting is inference-only).
_ATTENTION_FORMULAS: dict[str, Callable[..., int]] = {
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_flops,  # CPU, with or without mask
    "_scaled_dot_product_flash_attention": _sdpa_flops,  # CUDA flash
    "_scaled_dot_product_efficient_attention": _sdpa_flops,  # CUDA mem-efficient (attn_bias)
    "_scaled_dot_product_cudnn_attention": _sdpa_flops,  # CUDA cuDNN (attn_bias)
    "_scaled_dot_product_fused_attention_overrideable": _sdpa_flops,  # XPU / out-of-tree backends
    "_scaled_dot_product_attention_math_for_mps": _sdpa_flops,  # Apple MPS
    "_native_multi_head_attention": _native_mha_flops,
    "_transformer_encoder_layer_fwd": _transformer_encoder_layer_flops,
}

ATTENTION_OPS: tuple[str, ...] = tuple(_ATTENTION_FORMULAS)
"""Names of the aten ops whose FLOPs vitbench guarantees to count (torch's formula or ours)."""


def attention_flop_formulas() -> dict[Any, Callable[..., int]]:
    """The ``custom_mapping`` for ``FlopCounterMode`` that makes fused attention count.

    Only ops torch has no formula for are returned (in torch 2.13: the CPU flash kernel, the
    overrideable and MPS kernels, and the two ``nn`` fast paths); the CUDA kernels already have
    torch formulas of the same value, which are left in charge. Ops this torch build lacks are
    skipped. Usable directly: ``FlopCounterMode(custom_mapping=attention_flop_formulas())``.
    """
    mapping: dict[Any, Callable[..., int]] = {}
    for name, formula in _ATTENTION_FORMULAS.items():
        if not hasattr(torch.ops.aten, name):
            continue
        packet = getattr(torch.ops.aten, name)
        if packet not in flop_registry:
            mapping[packet] = formula
    return mapping


# --- counting ------------------------------------------------------------------------------


def count_gmacs(model: nn.Module, images: torch.Tensor, *, what: Optional[str] = None) -> GmacsResult:
    """Count the GMACs of ``model`` on each of ``images`` (``[n, C, H, W]``), one at a time.

    Each image runs at batch 1 through the real forward in ``eval()`` and
    ``torch.inference_mode()`` (docs/measuring.md); every module's training flag is restored
    afterwards. Images are moved to the model's device and floating-point dtype. Count the
    eager model: a ``torch.compile`` wrapper is refused. A forward whose output holds NaN/inf
    raises :class:`~vitbench.errors.NonFiniteError`: the count of a broken forward (whose
    input-dependent decisions were taken on NaNs) is not a measurement. ``what``: report the
    images as a :mod:`vitbench.core.progress` step of that name (a run's count, not a search's).
    """
    check_model(model)
    if not isinstance(images, torch.Tensor):
        raise ParamError(f"images must be a torch.Tensor of shape [n, C, H, W], got {type(images).__name__}")
    if images.dim() != 4 or images.shape[0] < 1:
        raise ParamError(f"images must have shape [n, C, H, W] with n >= 1, got {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ParamError(f"images must be floating point, got dtype {images.dtype}")
    device, dtype = model_device_dtype(model)
    images = images.to(device=device if device is not None else images.device, dtype=dtype)

    mapping = attention_flop_formulas()
    per_image: list[float] = []
    with eval_mode(model), torch.inference_mode():
        indices = range(images.shape[0])
        for i in indices if what is None else progress.track(indices, what, unit="images"):
            counter = FlopCounterMode(display=False, custom_mapping=mapping)
            with counter:
                out = model(images[i : i + 1])
            check_finite(out, "GMACs: the counted forward's outputs", f"on image {i + 1} of {images.shape[0]}")
            per_image.append(counter.get_total_flops() / 2 / 1e9)

    n = len(per_image)
    mean = float(statistics.mean(per_image))
    std = float(statistics.stdev(per_image)) if n > 1 else 0.0
    check_metrics({"gmacs": mean, "gmacs_std": std}, "GMACs")  # a plugin's op formula may return NaN
    return GmacsResult(mean=mean, std=std, n=n)


def count_gmacs_at(
    model: nn.Module, input_size: tuple[int, int, int] = (3, 224, 224), n: int = 1, seed: int = 0
) -> GmacsResult:
    """:func:`count_gmacs` on ``n`` seeded standard-normal images of ``input_size`` (C, H, W).

    Enough for a fixed-cost model; an input-dependent method should be counted on real
    evaluation images instead (docs/measuring.md: default 100).
    """
    size = check_input_size(input_size)
    check_int("n", n, 1)
    check_int("seed", seed, 0)
    return count_gmacs(model, random_images(n, size, seed=seed))
