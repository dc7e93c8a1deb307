"""Peak memory of one forward pass, in MB (2**20 bytes) (docs/measuring.md, "Peak memory").

On CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (weights and input
included). On the CPU: the growth of the process's resident set during the forward (activations
and workspaces, not the weights), read from the kernel's high-water mark, else a sampling
thread, else ``ru_maxrss``; a warm-up forward and ``malloc_trim`` come first, so CPU numbers are
approximate to a few MB and comparable only with CPU numbers."""
from __future__ import annotations

import gc
import os
import re
import sys
import threading
from collections.abc import Callable

import torch
from torch import nn

from vitbench.errors import ParamError
from vitbench.measure._common import (
    BYTES_PER_MB,
    batch_of,
    check_input_size,
    check_int,
    check_model,
    check_model_on,
    eval_mode,
    model_device_dtype,
    resolve_device,
    synchronize,
)
from vitbench.host.allocator import glibc
from vitbench.measure.precision import autocast

__all__ = ["measure_peak_memory"]

_SAMPLE_INTERVAL_S = 0.0005


def measure_peak_memory(
    model: nn.Module, batch_size: int, input_size: tuple[int, int, int] = (3, 224, 224),
    device: str | torch.device = "cpu", warmup: int = 1, precision: str = "fp32",
    images: torch.Tensor | None = None,
) -> float:
    """Peak memory in MB (2**20 bytes) of one forward at ``batch_size`` (see the module docstring),
    on ``images`` taken in turn when given, else seeded noise.

    Runs in ``eval()`` and ``torch.inference_mode()`` (under autocast for ``precision`` fp16/bf16); restores every module's training flag.
    The model must already be on ``device``. Raises ParamError for ``batch_size < 1`` and
    other bad arguments.
    """
    check_model(model, allow_compiled=True)  # --compile times the compiled model
    check_int("batch_size", batch_size, 1)
    size = check_input_size(input_size)
    check_int("warmup", warmup, 0)
    dev = resolve_device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ParamError(f"peak memory is measured on 'cpu' or 'cuda' only, got device={str(device)!r}")
    check_model_on(model, dev)
    _, dtype = model_device_dtype(model)
    x = batch_of(images, batch_size, size, dtype=dtype, device=dev)

    with eval_mode(model), torch.inference_mode(), autocast(precision, dev):
        for _ in range(warmup):
            model(x)
        synchronize(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
            model(x)
            torch.cuda.synchronize(dev)
            return torch.cuda.max_memory_allocated(dev) / BYTES_PER_MB
        growth = cpu_rss_growth_bytes(lambda: model(x))
    return growth / BYTES_PER_MB


# --- CPU resident-set growth ---------------------------------------------------------------


def cpu_rss_growth_bytes(fn: Callable[[], object]) -> int:
    """Peak resident-set growth in bytes while ``fn()`` runs (>= 0), best method available."""
    _release_freed_memory()
    if _reset_high_water_mark():
        before = _read_status_kib("VmRSS")
        fn()
        peak = _read_status_kib("VmHWM")
        if before is not None and peak is not None:
            return max(0, peak - before) * 1024
    reader = _rss_reader()
    if reader is not None:
        return _sampled_growth(fn, reader)
    return _maxrss_growth(fn)


def _release_freed_memory() -> None:
    """Collect garbage and ask glibc to return free heap pages to the OS (no-op elsewhere)."""
    gc.collect()
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


def _reset_high_water_mark() -> bool:
    """Reset the kernel's peak-RSS counter (``VmHWM``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _read_status_kib("VmHWM") is not None


def _read_status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (e.g. VmRSS, VmHWM), or None if unreadable."""
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _rss_reader() -> Callable[[], int] | None:
    """A function returning the current RSS in bytes: /proc/self/statm, else psutil, else None."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as f:
            f.read()
    except (OSError, ValueError, AttributeError):
        pass
    else:

        def read_statm() -> int:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page

        return read_statm
    try:
        import psutil  # optional; not a dependency
    except ImportError:
        return None
    proc = psutil.Process()
    return lambda: int(proc.memory_info().rss)


def _sampled_growth(fn: Callable[[], object], read_rss: Callable[[], int]) -> int:
    """Peak RSS growth while ``fn()`` runs, sampled by a background thread."""
    before = read_rss()
    peak = before
    done = threading.Event()
    sampling = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, read_rss())
            sampling.set()
            done.wait(_SAMPLE_INTERVAL_S)

    thread = threading.Thread(target=sample, name="vitbench-rss-sampler", daemon=True)
    thread.start()
    sampling.wait()  # the sampler is running before fn starts, even on a loaded machine
    try:
        fn()
        last = read_rss()
    finally:
        done.set()
        thread.join()
    return max(0, max(peak, last) - before)


def _maxrss_growth(fn: Callable[[], object]) -> int:
    """Growth of ``ru_maxrss`` across ``fn()``: a lower bound (KiB on Linux, bytes on macOS)."""
    import resource  # POSIX only; imported here so the module loads everywhere

    unit = 1 if sys.platform == "darwin" else 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(0, after - before) * unit
