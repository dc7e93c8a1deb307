"""The numeric precision a run measures in (``--precision``; docs/measuring.md, "Throughput and latency").

``fp32`` runs the model as it is; ``fp16`` and ``bf16`` run it under ``torch.autocast`` with
that dtype (weights stay fp32), for the timed and peak-memory forwards, evaluation and the IB
metric. Fine-tuning runs under ``bf16`` autocast, but in fp32 for ``fp16`` (a loss scaler's
skipped steps are what the non-finite guard stops a run for), and the record says so. GMACs
are counted in fp32 whatever the precision."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ContextManager

import torch

from vitbench.core.option_values import DEFAULT_PRECISION, PRECISIONS, check_precision  # noqa: F401 (re-exported)

__all__ = ["DEFAULT_PRECISION", "PRECISIONS", "autocast", "autocast_method", "check_precision", "dtype_of",
           "trains_in"]

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


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
