"""Forwards that never read the device from the host, for CUDA graphs (``--cuda-graph``;
docs/token-state.md, "Forwards a CUDA graph can capture").

Nothing in a captured forward may copy a device value to the host (``bool(t)``, ``.item()``,
``nonzero``): the host would decide on a value from capture time. The two places in the engine
that do give way inside :func:`device_only`: :meth:`TokenState.keep`'s prefix check is skipped
(the same forward ran, checked, outside the capture first), and PPT computes both branches and
selects per image. :func:`host_reads_allowed` is ``False`` inside :func:`device_only`, while a
stream captures and while ``torch.compile`` traces (a host read there breaks the graph). A
method whose shapes depend on the data cannot be captured; the capture in
:mod:`vitbench.measure.cuda_graph` finds that out and times it eagerly."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["device_only", "host_reads_allowed"]

_DEPTH = 0


@contextlib.contextmanager
def device_only() -> Iterator[None]:
    """Run the forwards inside without host reads of device values (module docstring)."""
    global _DEPTH
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1


def host_reads_allowed() -> bool:
    """Whether the forward may read a device value on the host: not inside :func:`device_only`,
    nor while ``torch.compile`` traces it, nor while the current CUDA stream captures a graph."""
    if _DEPTH > 0 or torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
