"""Shared plumbing of the measurement functions: input checks, eval mode, devices, inputs.

Every measurement in docs/measuring.md runs the model in ``eval()`` under ``inference_mode()``
on an input already on the device; these helpers do that one way for all of them, and turn
bad arguments into :class:`~vitbench.errors.ParamError` messages that name the bad value.
"""
from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from vitbench.errors import ParamError, VitbenchError

#: One megabyte as the memory measurements report it (2**20 bytes, as torch's memory summary).
BYTES_PER_MB = 2**20


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int (not a bool) ``>= minimum``, else raise ParamError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParamError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ParamError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_input_size(input_size: object) -> tuple[int, int, int]:
    """Return ``input_size`` as a ``(C, H, W)`` tuple of positive ints, else raise ParamError."""
    if (
        not isinstance(input_size, Sequence)
        or isinstance(input_size, str)
        or len(input_size) != 3
        or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in input_size)
    ):
        raise ParamError(
            f"input_size must be (channels, height, width) of positive integers, got {input_size!r}"
        )
    c, h, w = (int(v) for v in input_size)
    return (c, h, w)


def check_model(model: object, allow_compiled: bool = False, needs_values: bool = True) -> nn.Module:
    """Refuse anything but an ``nn.Module``, one whose tensors are on the meta device when the
    measurement runs it (``needs_values``), and a ``torch.compile``d one unless ``allow_compiled``
    (the timings under ``--compile``; GMACs and parameters are always counted on the eager model,
    docs/measuring.md)."""
    if not isinstance(model, nn.Module):
        raise ParamError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    meta = next((name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta), None) \
        if needs_values else None
    if meta is not None:
        raise ParamError(f"model has no values to run: {meta} is on the meta device; load or initialise its "
                         f"weights first (e.g. model.to_empty(device='cpu') and load a state dict)")
    if not allow_compiled and getattr(model, "_orig_mod", None) is not None:
        raise ParamError(
            "model is wrapped by torch.compile; docs/measuring.md measures the eager model: "
            "pass model._orig_mod"
        )
    return model


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse ``device`` and check it is usable here (a clear error instead of a deep torch one)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ParamError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VitbenchError(f"device {device!r} was asked for but CUDA is not available here")
    return dev


def model_device_dtype(model: nn.Module) -> tuple[torch.device | None, torch.dtype]:
    """Device of the model's first parameter (None without parameters) and its float dtype.

    Inputs are made in the model's floating-point dtype (float32 if it has none), so a model
    cast to half precision is measured at half precision.
    """
    device: torch.device | None = None
    dtype = torch.float32
    for p in model.parameters():
        if device is None:
            device = p.device
        if p.is_floating_point():
            dtype = p.dtype
            break
    return device, dtype


def check_model_on(model: nn.Module, device: torch.device) -> None:
    """Raise if the model's parameters live elsewhere than ``device``.

    docs/measuring.md times only the forward with everything already on the device, so the
    measurement functions never move a model (that would also be a surprising side effect).
    """
    where, _ = model_device_dtype(model)
    if where is not None and where.type != device.type:
        raise ParamError(
            f"model is on {where} but device={str(device)!r} was asked for; "
            f"move it first with model.to({str(device)!r})"
        )


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on ``device`` so the clock reads finished work (no-op on CPU)."""
    if device.type == "cpu":
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return
    backend = getattr(torch, device.type, None)  # torch.mps, torch.xpu, ...
    sync = getattr(backend, "synchronize", None)
    if callable(sync):
        sync()


def random_images(
    n: int, input_size: tuple[int, int, int], *, seed: int = 0, dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[n, C, H, W]`` standard-normal images from a private seeded generator.

    A private generator keeps the global RNG untouched and the same seed gives the same images
    on every device (they are drawn on the CPU, then moved).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    images = torch.randn((n, *input_size), generator=gen, dtype=torch.float32)
    return images.to(device=device, dtype=dtype)


def batch_of(images: torch.Tensor | None, n: int, input_size: tuple[int, int, int], *,
             dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[n, C, H, W]``: the given ``images`` ``[m, C, H, W]`` taken in turn (repeated when
    ``m < n``), or :func:`random_images` when ``images`` is None. ParamError for images of
    another size or none at all."""
    if images is None:
        return random_images(n, input_size, dtype=dtype, device=device)
    if images.dim() != 4 or tuple(images.shape[1:]) != tuple(input_size) or images.shape[0] == 0:
        raise ParamError(f"timing images of shape {tuple(images.shape)}; they must be [m, C, H, W] with m >= 1 "
                         f"and [C, H, W] = {list(input_size)}, the model's input size")
    picked = images[torch.arange(n) % images.shape[0]]
    return picked.to(device=device, dtype=dtype)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode and restore each one's own flag afterwards.

    ``model.train(was_training)`` would flatten mixed states (e.g. a frozen norm layer kept in
    eval inside a model being fine-tuned); restoring per module leaves the model as found.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag


def median_and_iqr(values: Sequence[float]) -> tuple[float, float]:
    """Median and interquartile range (Q3 - Q1, inclusive quartiles) of ``values``.

    The IQR is the spread reported for timings: unlike ``(max - min) / 2`` one scheduler hiccup
    among the repeats does not inflate it. It is 0.0 for a single value.
    """
    if not values:
        raise ParamError("no values to summarise")
    med = float(statistics.median(values))
    if len(values) < 2:
        return med, 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return med, float(q3 - q1)


def check_positive_finite(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite number > 0, else raise ParamError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParamError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(float(value)) or value <= 0:
        raise ParamError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
