"""ToMe's matching and merge as one compiled loop each, for CPU inference at small batches
(docs/measuring.md, "Batch 1 on a CPU").

At batch 1 on a CPU, a matching and a merge are some thirty small tensor operations, each
starting cold after the block's matrix products; here each is one numba loop
(:mod:`vitbench.engine._numba_kernels`), taken where :func:`usable` allows. Both paths give the
same partners (exact ties go to the first token, as ``max`` does; a near-tie that rounding
decides may differ, the products being summed in another order) and the same merged values.
``VITBENCH_CPU_KERNELS=0`` switches the loops off.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Optional

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["MAX_BATCH", "describe", "enabled", "match", "usable", "warm", "weighted_merge"]

#: the largest batch the loops take (one thread; from 8 images on the tensor path is as fast)
MAX_BATCH = 4

_ON: Optional[bool] = None  # None: read VITBENCH_CPU_KERNELS and try numba on first use
_kernels: Optional[ModuleType] = None
_why_off = ""


def _load() -> bool:
    global _ON, _kernels, _why_off
    if _ON is None:
        _ON = os.environ.get("VITBENCH_CPU_KERNELS", "1") != "0"
        _why_off = "" if _ON else "VITBENCH_CPU_KERNELS=0"
        if _ON:
            try:
                # cycle: vitbench.engine imports this module
                from vitbench.engine import _numba_kernels
            except ImportError as e:  # numba missing or broken for this Python: the tensor path
                _ON, _why_off = False, f"numba does not import: {e}"
            else:
                _kernels = _numba_kernels
    return _ON


def describe() -> str:
    """What a report says of the kernels: numba's version, or why they are off."""
    if not _load():
        return f"off ({_why_off or 'switched off'})"
    import numba

    return f"numba {numba.__version__} (ToMe's matching and merge in inference)"


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Switch the kernels on or off inside the block (on only where numba imports)."""
    global _ON
    was = _load()
    _ON = on and _kernels is not None
    try:
        yield
    finally:
        _ON = was


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels may take ``tensors`` (``[B, ...]``): on, at most :data:`MAX_BATCH`
    images, float32 plain CPU tensors no gradient needs, and no compiling, tracing or dispatch
    mode watching the operations."""
    # compiling first: dynamo then reads no module state here, so it sets no guard on it
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if not _load() or tensors[0].shape[0] > MAX_BATCH:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or t.device.type != "cpu" or t.dtype != torch.float32:
            return False
        if grad and t.requires_grad:
            return False
    return _get_current_dispatch_mode() is None


def _array(t: torch.Tensor) -> np.ndarray:
    """``t``'s memory as a NumPy array (no copy when ``t`` is contiguous)."""
    t = t.detach() if t.requires_grad else t
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def match(metric: torch.Tensor, r: int, prefix: int) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(unm_idx, src_idx, dst_idx)`` of the bipartite matching of ``metric [B, N, d]`` (``r``
    already capped), or ``None`` where a row's norm is 0 or not finite."""
    assert _kernels is not None
    ok, unm, src, dst = _kernels.match(_array(metric), r, prefix)
    return (torch.from_numpy(unm), torch.from_numpy(src), torch.from_numpy(dst)) if ok else None


def weighted_merge(x: torch.Tensor, size: torch.Tensor, prefix: int, a_start: int,
                   indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_new [B, N-r, C], size_new [B, N-r, 1])``: ToMe's size-weighted merge of ``x [B, N, C]``
    with sizes ``size [B, N, 1]`` by a matching's ``(unm_idx, src_idx, dst_idx)``."""
    assert _kernels is not None
    out, size_new = _kernels.weighted_merge(_array(x), _array(size), prefix, a_start, *map(_array, indices))
    return torch.from_numpy(out), torch.from_numpy(size_new)


def warm() -> bool:
    """Compile the kernels now (or load them from numba's cache): ``False`` when they are off."""
    if not _load():
        return False
    metric, x, size = torch.randn(1, 9, 4), torch.randn(1, 9, 3), torch.ones(1, 9, 1)
    found = match(metric, 2, 1)
    assert found is not None
    weighted_merge(x, size, 1, 1, found)
    return True
