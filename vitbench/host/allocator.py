"""glibc's malloc told to keep freed memory in the process, so a forward does not page-fault its
activations in again (docs/measuring.md, "The allocator").

By default glibc serves a large block (a batch's MLP activations) with a fresh ``mmap`` and, once
freed, hands it back to the kernel; the next forward then touches every page of it anew. On a
CPU that is thousands of page faults per forward, time in the kernel that grows with the token
count and varies from run to run. :func:`keep_freed_memory` raises the thresholds with
``mallopt`` (the settings that PyTorch's CPU launcher gets from jemalloc or tcmalloc instead):
blocks up to :data:`MMAP_THRESHOLD` come from the heap, and up to :data:`TRIM_THRESHOLD` of free
heap stays mapped. ``VITBENCH_MALLOPT=0`` leaves malloc as it is.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from typing import Optional

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "describe", "glibc", "keep_freed_memory"]

#: blocks below this come from the heap, not ``mmap`` (glibc's largest allowed value on 64-bit)
MMAP_THRESHOLD = 32 * 2**20
#: free memory at the top of the heap kept before it is returned to the kernel
TRIM_THRESHOLD = 2**30
#: ``mallopt``'s parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3

_state: Optional[str] = None  # what :func:`describe` says, once applied


def _mib(n: int) -> str:
    return f"{n // 2**30} GiB" if n % 2**30 == 0 else f"{n // 2**20} MiB"


def glibc() -> Optional[ctypes.CDLL]:
    """The process's C library when it is glibc (``mallopt``, ``malloc_trim``), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> str:
    """Apply the thresholds once per process (glibc only); returns :func:`describe`'s text."""
    global _state
    if _state is not None:
        return _state
    if os.environ.get("VITBENCH_MALLOPT", "1") == "0":
        _state = "system default (VITBENCH_MALLOPT=0)"
    elif (libc := glibc()) is None:
        _state = "system default (not glibc)"
    else:
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        _state = (f"glibc malloc, freed memory kept (mmap threshold {_mib(MMAP_THRESHOLD)}, "
                  f"trim threshold {_mib(TRIM_THRESHOLD)})" if ok else "system default (mallopt refused)")
    return _state


def describe() -> str:
    """What a report says of the allocator: the thresholds applied, or the system's default."""
    return _state if _state is not None else "system default"
