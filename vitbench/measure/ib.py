"""The information-bottleneck loss and its variational bound (docs/methods.md §6; IBTM/LTM papers,
Section 3 and Theorem 3.1; DCS paper, the IB loss of its retraining phase).

Everything is written on soft cluster assignments so it is differentiable (LTM and DCS train
with the bound) and so it is a metric for every method, baseline included:

- ``X~``: a layer's features, the size-weighted mean of its patch tokens
  (:func:`token_features`), so merged, pruned and plain models compare;
- ``X``: the input image, area-downsampled to at most 32x32, flattened (:func:`input_vectors`);
- both L2-normalised; clusters are the class centroids (mean of the normalised vectors of each
  class, normalised again; an absent class has a zero centroid), and the soft assignment is
  ``tau(v, a) = softmax_a(-||v - c_a||^2)`` (:func:`soft_assign`).

With ``p(a, b) = mean_i tau(X~_i, a) tau(X_i, b)`` and ``p(a, y) = mean_i tau(X~_i, a) 1[y_i = y]``
the IB loss is ``I(X~; X) - I(X~; Y)``; the bound is
``mean_i sum_{a,b} tau(X~_i,a) tau(X_i,b) log tau(X_i,b) - mean_i sum_a tau(X~_i,a) log Q(a|y_i)``.
Since ``sum_a tau(X~_i, a) = 1`` the first term equals ``mean_i sum_b tau(X_i,b) log tau(X_i,b)``,
a constant of the inputs (:attr:`IBTerms.input_constant`); the second is a cross-entropy
``>= H(A|Y)``, and ``H(A|Y) >= I(A;X) - I(A;Y)`` because ``I(A;X) <= H(A)`` -- Theorem 3.1:
``bound - input_constant >= IB loss`` (checked numerically by the tests).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.guards import check_finite, check_metrics

__all__ = [
    "IBTerms", "class_centroids", "ib_terms", "input_vectors", "log_q_given_y",
    "measure_ib", "soft_assign", "token_features", "final_features",
]

#: inputs are area-downsampled so that their longer side is at most this (ImageNet stays tractable)
INPUT_SIDE = 32
_EPS = 1e-12


@dataclass(frozen=True)
class IBTerms:
    """The IB loss, the bound and their parts (nats). Tensors (0-d) so they can be losses."""

    loss: torch.Tensor  # I(X~;X) - I(X~;Y)
    bound: torch.Tensor  # Theorem 3.1's variational upper bound (up to the input constant)
    mi_feature_input: torch.Tensor  # I(X~;X)
    mi_feature_label: torch.Tensor  # I(X~;Y)
    input_constant: torch.Tensor  # mean_i sum_b tau(X_i,b) log tau(X_i,b): inputs only


def input_vectors(images: torch.Tensor, max_side: int = INPUT_SIDE) -> torch.Tensor:
    """``images [B, C, H, W]`` -> ``[B, D]``: area-downsampled to at most ``max_side`` per side,
    flattened and L2-normalised (docs/methods.md §6)."""
    if images.dim() != 4:
        raise ValueError(f"images must be [B, C, H, W], got shape {tuple(images.shape)}")
    h, w = images.shape[-2:]
    scale = max(h, w) / max_side
    if scale > 1:
        images = F.adaptive_avg_pool2d(images, (max(1, round(h / scale)), max(1, round(w / scale))))
    return F.normalize(images.flatten(1).float(), dim=1)


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


def class_centroids(vectors: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[K, D]``: per class, the mean of the L2-normalised ``vectors`` of that class, normalised."""
    v = F.normalize(vectors.float(), dim=1)
    onehot = F.one_hot(labels.long(), num_classes).to(v.dtype)  # [n, K]
    sums = onehot.t() @ v
    return F.normalize(sums, dim=1)  # an absent class: a zero row (normalize keeps it zero)


def soft_assign(vectors: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``tau(v, a) = softmax_a(-||v - c_a||^2)`` of the L2-normalised ``vectors`` -> ``[n, K]``."""
    v = F.normalize(vectors.float(), dim=1)
    return (-torch.cdist(v, centroids.float()).pow(2)).softmax(dim=1)


def log_q_given_y(tau_f: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``log Q(a|y)`` ``[K_y, K_a]``: the mean of ``tau(X~, a)`` over the samples of class ``y``
    (LTM's Algorithm 1 refreshes it every epoch). A class without samples gets uniform Q."""
    onehot = F.one_hot(labels.long(), num_classes).to(tau_f.dtype)  # [n, Ky]
    counts = onehot.sum(0)[:, None]
    q = (onehot.t() @ tau_f) / counts.clamp_min(1)
    q = torch.where(counts > 0, q, torch.full_like(q, 1.0 / tau_f.shape[1]))
    return q.clamp_min(_EPS).log()


def _mutual_information(joint: torch.Tensor) -> torch.Tensor:
    pa, pb = joint.sum(1, keepdim=True), joint.sum(0, keepdim=True)
    ratio = joint.clamp_min(_EPS) / (pa * pb).clamp_min(_EPS)
    return (joint * ratio.log()).sum()


def ib_terms(tau_f: torch.Tensor, tau_x: torch.Tensor, labels: torch.Tensor, num_classes: int,
             log_q: Optional[torch.Tensor] = None) -> IBTerms:
    """IB loss and bound from soft assignments ``tau_f [n, K]`` (features) and ``tau_x [n, K']``
    (inputs) and ``labels [n]``. ``log_q [K, K_a]``: ``log Q(a|y)`` from the previous epoch; by
    default computed from these very samples (then the cross-entropy term equals ``H(A|Y)``)."""
    n = tau_f.shape[0]
    onehot = F.one_hot(labels.long(), num_classes).to(tau_f.dtype)
    joint_fx = tau_f.t() @ tau_x / n
    joint_fy = tau_f.t() @ onehot / n
    mi_fx, mi_fy = _mutual_information(joint_fx), _mutual_information(joint_fy)
    if log_q is None:
        log_q = log_q_given_y(tau_f, labels, num_classes)
    input_constant = (tau_x * tau_x.clamp_min(_EPS).log()).sum(1).mean()
    cross = -(tau_f * log_q[labels.long()]).sum(1).mean()
    bound = (tau_f.sum(1) * (tau_x * tau_x.clamp_min(_EPS).log()).sum(1)).mean() + cross
    return IBTerms(loss=mi_fx - mi_fy, bound=bound, mi_feature_input=mi_fx,
                   mi_feature_label=mi_fy, input_constant=input_constant)


def final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: :func:`token_features` of the last block's output for ``images``.

    Works on a plain timm ViT (sizes all one) and on a reduced one (the token sizes of the
    forward's :class:`~vitbench.engine.TokenState`, so merged tokens count by their size). A
    model without ``blocks`` (conv hybrids, Swin) gives the spatial mean of its final feature
    map, which every method's output is folded back into: ``[B, C, H, W]``, or ``[B, H, W, C]``
    where timm says its output is channels-last (``output_fmt`` NHWC: Swin)."""
    from vitbench.engine.block import reduction_context

    if not hasattr(model, "blocks"):  # MobileViT, EfficientViT, Swin: the final map's mean
        fmap = model.forward_features(images)
        if fmap.dim() != 4:
            return fmap.mean(dim=1)
        nhwc = getattr(model, "output_fmt", "NCHW") == "NHWC"
        return fmap.mean(dim=(1, 2)) if nhwc else fmap.mean(dim=(-2, -1))
    tokens = block_output(model, model.blocks[-1], images)
    ctx = reduction_context(model)
    size = ctx.state.size if ctx is not None and ctx.state is not None else None
    return token_features(tokens, int(getattr(model, "num_prefix_tokens", 1)), size)


def block_output(model: nn.Module, block: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """What ``block`` (a module of ``model``) outputs during ``model(images)``."""
    captured: dict[str, torch.Tensor] = {}
    handle = block.register_forward_hook(lambda mod, args, out: captured.__setitem__("out", out))
    try:
        model(images)
    finally:
        handle.remove()
    return captured["out"]


def measure_ib(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
               num_classes: int, device: str = "cpu",
               features: Callable[[nn.Module, torch.Tensor], torch.Tensor] = final_features) -> IBTerms:
    """IB loss and bound of ``model`` over ``batches`` of ``(normalised images, labels)``
    (docs/measuring.md: on the evaluation split, final block). Centroids and ``Q(a|y)`` come from
    the same samples. Non-finite features (naming the batch) or results raise
    :class:`~vitbench.errors.NonFiniteError` instead of a NaN in the report."""
    feats, inputs, labels = [], [], []
    model.eval()
    with torch.inference_mode():
        for k, (images, y) in enumerate(batches, start=1):
            images = images.to(device)
            feats.append(features(model, images).float().cpu())
            check_finite(feats[-1], "IB metrics: the final features", f"in batch {k}")
            inputs.append(input_vectors(images).cpu())
            labels.append(y.cpu())
    if not feats:
        raise ValueError("measure_ib got no batches")
    f, x, y = torch.cat(feats), torch.cat(inputs), torch.cat(labels)
    tau_f = soft_assign(f, class_centroids(f, y, num_classes))
    tau_x = soft_assign(x, class_centroids(x, y, num_classes))
    terms = ib_terms(tau_f, tau_x, y, num_classes)
    check_metrics({"IB loss": terms.loss, "IB bound": terms.bound, "input constant": terms.input_constant},
                  "IB metrics")
    return terms
