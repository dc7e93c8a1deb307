"""Forwards that never read the device from the host, for CUDA graphs (``--cuda-graph``, issue 11).

A CUDA graph replays a fixed sequence of kernels: nothing in the captured forward may copy a
device value to the host (``bool(t)``, ``t.item()``, ``t.tolist()``, ``nonzero``), because the
host would decide on a value from capture time. Most of the engine never does. Two places do,
and give way inside :func:`device_only`:

- :meth:`TokenState.keep`'s prefix check (one ``.all()``) is skipped; the same forward ran,
  checked, outside the capture first;
- PPT's shortcut when every image of the batch pools, or none does (two ``.any()``/``.all()``):
  both branches are computed and selected per image on the device, as for a mixed batch.

:func:`host_reads_allowed` is ``False`` inside :func:`device_only` and while a CUDA stream
captures a graph. A method whose *shapes* depend on the data (ATS, learned keep counts) has to
read the device to size its tensors, so it cannot be captured; vitbench's graph capture
(:mod:`vitbench.measure.cuda_graph`) finds that out and times it eagerly, saying why.
"""
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
    nor while the current CUDA stream captures a graph."""
    if _DEPTH > 0:
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
