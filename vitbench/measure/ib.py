"""The information-bottleneck loss and its variational bound (docs/methods.md, "The IB loss"; IBTM/LTM papers,
Section 3 and Theorem 3.1; DCS paper, the IB loss of its retraining phase).

Written on soft cluster assignments, so it is differentiable (LTM and DCS train with the bound)
and a metric for every method, baseline included: ``X~`` the size-weighted mean of a layer's
patch tokens (:func:`~vitbench.engine.features.token_features`), ``X`` the downsampled input
(:func:`input_vectors`), clusters the class centroids, ``tau(v, a) = softmax_a(-||v - c_a||^2)`` (:func:`soft_assign`).
The IB loss is ``I(X~; X) - I(X~; Y)``; ``bound - input_constant >= IB loss`` (Theorem 3.1,
:attr:`IBTerms.input_constant`)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.engine.features import block_output, features_during, module_features, pooled_features, token_features
from vitbench.core.guards import check_finite, check_metrics
from vitbench.errors import UnsupportedError
from vitbench.host import get_host

__all__ = [
    "ClassSums", "IBSamples", "IBTerms", "block_output", "class_centroids", "ib_terms", "input_vectors", "log_q_from_sums",
    "log_q_given_y", "measure_ib", "module_features", "pooled_features", "soft_assign", "token_features",
    "feature_source", "final_features", "final_features_during",
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
    flattened and L2-normalised (docs/methods.md, "The IB loss")."""
    if images.dim() != 4:
        raise ValueError(f"images must be [B, C, H, W], got shape {tuple(images.shape)}")
    h, w = images.shape[-2:]
    scale = max(h, w) / max_side
    if scale > 1:
        images = F.adaptive_avg_pool2d(images, (max(1, round(h / scale)), max(1, round(w / scale))))
    return F.normalize(images.flatten(1).float(), dim=1)


def class_centroids(vectors: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[K, D]``: per class, the mean of the L2-normalised ``vectors`` of that class, normalised."""
    v = F.normalize(vectors.float(), dim=1)
    sums = ClassSums()
    sums.add(F.one_hot(labels.long(), num_classes).to(v.dtype), v)
    return sums.centroids()  # an absent class: a zero row (normalize keeps it zero)


@dataclass
class ClassSums:
    """Per-class sums of vectors over a data pass, batch by batch, and the per-class counts: the
    class centroids and ``Q(a|y)`` of LTM's Algorithm 1 and of the IB bounds (docs/methods.md, "The IB loss")."""

    sums: Optional[torch.Tensor] = None  # [K, D]
    counts: Optional[torch.Tensor] = None  # [K]

    def add(self, rows: torch.Tensor, vectors: torch.Tensor) -> None:
        """Add ``vectors [n, D]`` to the classes of ``rows [n, K]`` (one-hot labels, per vector)."""
        sums, counts = rows.t() @ vectors, rows.sum(0)
        self.sums = sums if self.sums is None else self.sums + sums
        self.counts = counts if self.counts is None else self.counts + counts

    def means(self) -> torch.Tensor:
        """``[K, D]``: the mean vector of each class (a class without samples: zeros)."""
        return self.sums / self.counts.clamp_min(1)[:, None]

    def centroids(self) -> torch.Tensor:
        """``[K, D]``: the sums L2-normalised (:func:`class_centroids` of normalised vectors)."""
        return F.normalize(self.sums, dim=1)

    def log_q(self) -> torch.Tensor:
        """``log Q(a|y)`` when the vectors added were soft assignments ``tau [n, K_a]``."""
        return log_q_from_sums(self.sums, self.counts)


def soft_assign(vectors: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``tau(v, a) = softmax_a(-||v - c_a||^2)`` of the L2-normalised ``vectors`` -> ``[n, K]``."""
    v = F.normalize(vectors.float(), dim=1)
    return (-torch.cdist(v, centroids.float()).pow(2)).softmax(dim=1)


def log_q_given_y(tau_f: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``log Q(a|y)`` ``[K_y, K_a]``: the mean of ``tau(X~, a)`` over the samples of class ``y``
    (LTM's Algorithm 1 refreshes it every epoch). A class without samples gets uniform Q."""
    sums = ClassSums()
    sums.add(F.one_hot(labels.long(), num_classes).to(tau_f.dtype), tau_f)
    return sums.log_q()


def log_q_from_sums(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``log Q(a|y)`` ``[K_y, K_a]`` from per-class sums of ``tau`` and the class counts ``[K_y]``
    (clamped at 1e-12; a class without samples gets uniform Q)."""
    q = sums / counts.clamp_min(1)[:, None]
    q = torch.where(counts[:, None] > 0, q, torch.full_like(q, 1.0 / sums.shape[1]))
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


def feature_source(model: nn.Module) -> Optional[tuple[nn.Module, bool]]:
    """The module whose pooled output is ``model``'s final features, and whether its map is
    ``[B, H, W, C]``: the family's :attr:`~vitbench.catalog.FamilySpec.feature_module` (a ViT's
    last block, a hybrid's or Swin's last stage) and ``channels_last``; ``None`` when no family
    names one. The IB metric and every IB training term (LTM, DCS) read this one module."""
    family = _family_of(model)
    if family is None or family.feature_module is None:
        return None
    return family.feature_module(model), family.channels_last


def final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: the final features of ``model(images)``: :func:`module_features` of
    :func:`feature_source` (a ViT: the size-weighted mean of the last block's patch tokens; a
    hybrid or Swin: the last stage's map averaged over its positions).

    A family that names no feature module: its ``final_features``, else the spatial mean of
    ``forward_features`` (``[B, C, H, W]``, or ``[B, H, W, C]`` where timm says its output is
    channels-last, ``output_fmt`` NHWC)."""
    source = feature_source(model)
    if source is not None:
        return module_features(model, source[0], images, channels_last=source[1])
    family = _family_of(model)
    if family is not None and family.final_features is not None:
        return family.final_features(model, images)
    fmap = model.forward_features(images)
    if fmap.dim() != 4:
        return fmap.mean(dim=1)
    nhwc = getattr(model, "output_fmt", "NCHW") == "NHWC"
    return fmap.mean(dim=(1, 2)) if nhwc else fmap.mean(dim=(-2, -1))


def _family_of(model: nn.Module) -> Any:
    """The family adapter that recognises ``model``, or ``None``."""
    try:
        return get_host().family_of(model)
    except UnsupportedError:
        return None


class IBSamples:
    """What the IB metric reads, gathered batch by batch: each image's final features, its input
    vector (:func:`input_vectors`) and its label; :meth:`terms` turns them into the metric."""

    def __init__(self) -> None:
        self.feats: list[torch.Tensor] = []
        self.inputs: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def __len__(self) -> int:
        return sum(len(y) for y in self.labels)

    def add(self, features: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> None:
        """One batch: ``features [B, C]``, the normalised ``images [B, C, H, W]``, ``labels [B]``."""
        if not features.shape[0] == images.shape[0] == labels.shape[0]:
            raise ValueError(f"IB samples of one batch disagree in size: {features.shape[0]} features, "
                             f"{images.shape[0]} images, {labels.shape[0]} labels")
        self.feats.append(features.detach().float().cpu())
        check_finite(self.feats[-1], "IB metrics: the final features", f"in batch {len(self.feats)}")
        self.inputs.append(input_vectors(images.detach()).cpu())
        self.labels.append(labels.detach().cpu())

    def terms(self, num_classes: int) -> IBTerms:
        """The IB loss and bound over every sample added (centroids and ``Q(a|y)`` from them)."""
        if not self.feats:
            raise ValueError("measure_ib got no batches")
        f, x, y = torch.cat(self.feats), torch.cat(self.inputs), torch.cat(self.labels)
        tau_f = soft_assign(f, class_centroids(f, y, num_classes))
        tau_x = soft_assign(x, class_centroids(x, y, num_classes))
        terms = ib_terms(tau_f, tau_x, y, num_classes)
        check_metrics({"IB loss": terms.loss, "IB bound": terms.bound, "input constant": terms.input_constant},
                      "IB metrics")
        return terms


def measure_ib(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
               num_classes: int, device: str = "cpu",
               features: Callable[[nn.Module, torch.Tensor], torch.Tensor] = final_features) -> IBTerms:
    """IB loss and bound of ``model`` over ``batches`` of ``(normalised images, labels)``
    (docs/measuring.md: on the evaluation split, final block). Centroids and ``Q(a|y)`` come from
    the same samples. Non-finite features (naming the batch) or results raise
    :class:`~vitbench.errors.NonFiniteError` instead of a NaN in the report."""
    samples = IBSamples()
    model.eval()
    with torch.inference_mode():
        for images, y in batches:
            images = images.to(device)
            samples.add(features(model, images), images, y)
    return samples.terms(num_classes)


def final_features_during(model: nn.Module, seen: Callable[[torch.Tensor, torch.Tensor], None]) -> Any:
    """:func:`~vitbench.engine.features.features_during` on the module :func:`final_features`
    reads; ``None`` for a model whose family names no feature module (its features need their
    own pass)."""
    source = feature_source(model)
    return None if source is None else features_during(model, source[0], seen, channels_last=source[1])
