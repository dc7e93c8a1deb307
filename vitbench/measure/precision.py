"""The numeric precision a run measures in (``--precision``; issue 11, docs/measuring.md).

``fp32`` runs the model as it is. ``fp16`` and ``bf16`` run it under ``torch.autocast`` with
that dtype on the run's device -- the way users run these models on a GPU: the weights stay
fp32, matmuls, convolutions and attention run in half precision, reductions and softmax
where autocast keeps them in fp32. Where it applies:

- the timed forwards (throughput, latency) and the peak-memory forward;
- evaluation (top-1/top-5, box/mask mAP) and the IB metric; the logits handed to the metric
  are cast back to fp32 (:class:`~vitbench.mm.classifier.TimmLogits`);
- fine-tuning in ``bf16`` (bf16 keeps fp32's exponent range, so gradients need no loss
  scaling). ``fp16`` fine-tuning stays fp32: fp16 needs a loss scaler whose skipped steps on
  overflowing gradients are exactly what vitbench's non-finite guard stops a run for, so a
  learnable method is trained in fp32 and measured in fp16 (stated in the record).

GMACs are counted in fp32 whatever the precision: a multiply-add is one in any dtype.
``bf16`` works on the CPU too (oneDNN); ``fp16`` autocast on a CPU is allowed but slow.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ContextManager

import torch

from vitbench.errors import choices_error

__all__ = ["DEFAULT_PRECISION", "PRECISIONS", "autocast", "autocast_method", "check_precision", "dtype_of",
           "trains_in"]

PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_PRECISION = "fp32"
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check_precision(name: str) -> str:
    """``name`` when it is a precision, else a clear error listing the valid ones."""
    if name not in PRECISIONS:
        raise choices_error("precision", name, PRECISIONS)
    return name


def dtype_of(precision: str) -> torch.dtype:
    """The autocast dtype of ``precision`` (``torch.float32`` for ``fp32``)."""
    return _DTYPES.get(check_precision(precision), torch.float32)


def autocast(precision: str, device: str | torch.device) -> ContextManager:
    """A context running the model's forward in ``precision`` on ``device``: nothing for
    ``fp32``, ``torch.autocast`` with the half dtype otherwise."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=_DTYPES[precision])


def trains_in(precision: str) -> str:
    """The precision fine-tuning runs in for a run measured in ``precision`` (see the module
    docstring: ``fp16`` runs fine-tune in fp32)."""
    return "bf16" if check_precision(precision) == "bf16" else "fp32"


@contextlib.contextmanager
def autocast_method(obj: Any, name: str, precision: str, device: str | torch.device,
                    to_float: bool = False) -> Iterator[None]:
    """Run ``obj.<name>`` under :func:`autocast` while the context is open (an instance
    attribute shadowing the method, removed afterwards); ``to_float`` casts the floating-point
    tensors it returns (a tensor, or a tuple/list of them) back to fp32.

    Why not an autocast around ``runner.test()``: mmengine's ``TestLoop`` wraps every iteration
    in its own ``autocast(enabled=fp16)``, which *disables* an outer autocast; a context opened
    inside the model's step comes after it and wins. Evaluation patches ``test_step`` (cls) or a
    detector's ``extract_feat`` with ``to_float`` (det/seg: backbone and neck in half precision,
    heads and post-processing in fp32 -- mmcv's NMS has no bf16/fp16 CPU kernel)."""
    if check_precision(precision) == "fp32":
        yield
        return
    method = getattr(obj, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        with autocast(precision, device):
            out = method(*args, **kwargs)
        return _float(out) if to_float else out

    setattr(obj, name, call)
    try:
        yield
    finally:
        delattr(obj, name)


def _float(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, (tuple, list)):
        return type(out)(_float(o) for o in out)
    return out
