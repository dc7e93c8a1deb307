"""Finiteness checks that turn silent garbage into an error naming what and where.

A NaN does not announce itself: a diverged fine-tuning leaves NaN method parameters, the
evaluation then scores NaN logits as wrong answers and the report shows a plausible-looking
0.00 % row. Every place a number is produced checks it here and raises
:class:`~vitbench.errors.NonFiniteError`, which the executor records as the run's ``error``.

The checks are cheap: one ``torch.isfinite(...).all()`` (a single device sync) over all values
at once; the slow search for *which* value is bad only runs once something is bad.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import torch
from torch import nn

from vitbench.errors import NonFiniteError

__all__ = ["check_finite", "check_gradients", "check_losses", "check_metrics", "nonfinite_tensors",
           "train_position"]


def _value(v: torch.Tensor | float) -> str:
    if isinstance(v, torch.Tensor):
        v = v.detach().float()
        if v.numel() != 1:
            bad = int((~torch.isfinite(v)).sum())
            return f"{bad} of {v.numel()} values"
        v = float(v)
    return f"{v:g}"


def train_position(stage: str, epoch: Optional[int], iteration: int) -> str:
    """``in stage 'finetune', epoch 1, iteration 37`` (both counted from 1)."""
    where = f"in stage {stage!r}"
    if epoch is not None:
        where += f", epoch {epoch}"
    return f"{where}, iteration {iteration}"


def check_losses(losses: Mapping[str, torch.Tensor | float], who: str, where: str) -> None:
    """Raise when any loss term is non-finite, naming the terms that are
    (``ltm: the loss became non-finite (extra = nan) in stage ...``).

    ``losses`` maps term names (``ce``, ``extra``, ``loss_cls``, ...) to values; the total
    (key ``loss``) is named only when no single term explains it.
    """
    values = [torch.as_tensor(v).detach().float().reshape(-1) for v in losses.values()]
    if not values or bool(torch.isfinite(torch.cat([v.cpu() for v in values])).all()):
        return
    bad = [k for k, v in losses.items() if not bool(torch.isfinite(torch.as_tensor(v).detach().float()).all())]
    named = [k for k in bad if k != "loss"] or bad
    terms = ", ".join(f"{k} = {_value(losses[k])}" for k in named)
    raise NonFiniteError(f"{who}: the loss became non-finite ({terms}) {where}")


def check_gradients(named_params: Iterable[tuple[str, nn.Parameter]], who: str, where: str) -> None:
    """Raise when a gradient holds NaN/inf, naming the first such parameter (and how many are).

    One ``torch._foreach_norm`` over every gradient (a finite norm means finite entries); only
    a gradient whose norm is not finite is inspected entry by entry, since the squares of
    finite entries above ~1e19 overflow float32.
    """
    pairs = [(n, p.grad) for n, p in named_params if p.grad is not None]
    if not pairs:
        return
    norms = torch._foreach_norm([g for _, g in pairs])
    if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        return
    # an infinite norm may only be an overflow of the squares (entries above ~1e19): look closer
    bad = [name for (name, g), norm in zip(pairs, norms)
           if not bool(torch.isfinite(norm)) and not bool(torch.isfinite(g).all())]
    if not bad:
        return
    more = f" and {len(bad) - 1} other parameter(s)" if len(bad) > 1 else ""
    grad = dict(pairs)[bad[0]]
    raise NonFiniteError(f"{who}: the gradient of {bad[0]}{more} became non-finite "
                         f"({_value(grad)}) {where}")


def nonfinite_tensors(obj: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """The floating-point tensors inside ``obj`` (nested tuples, lists, dicts, objects with
    tensor attributes such as mmdet's ``InstanceData``) that hold a NaN or inf, with their path."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel() and not bool(torch.isfinite(obj.detach()).all()):
            return [(path or "output", obj)]
        return []
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(obj, Mapping):
        items: Iterable[tuple[str, Any]] = ((str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(obj))
    elif hasattr(obj, "items") and callable(obj.items):  # mmengine's InstanceData / BaseDataElement
        items = ((str(k), v) for k, v in obj.items())
    else:
        return []
    for key, value in items:
        out += nonfinite_tensors(value, f"{path}.{key}" if path else key)
    return out


def check_finite(obj: Any, what: str, where: str) -> None:
    """Raise when ``obj`` (a tensor or nested structure of them) holds NaN/inf:
    ``evaluation: the logits hold non-finite values (12 of 60) in batch 3``."""
    bad = nonfinite_tensors(obj)
    if not bad:
        return
    path, tensor = bad[0]
    n_bad = int((~torch.isfinite(tensor.detach())).sum())
    part = f"{path}: " if path not in ("", "output") else ""
    raise NonFiniteError(f"{what} hold non-finite values ({part}{n_bad} of {tensor.numel()}) {where}".rstrip())


def check_metrics(metrics: Mapping[str, Any], what: str) -> None:
    """Raise when a numeric metric (mAP, GMACs, IB loss ...) is NaN or infinite."""
    bad = [k for k, v in metrics.items()
           if isinstance(v, (int, float, torch.Tensor)) and not isinstance(v, bool)
           and not math.isfinite(float(v))]
    if bad:
        raise NonFiniteError(f"{what}: non-finite " + ", ".join(f"{k} = {float(metrics[k])}" for k in bad))

