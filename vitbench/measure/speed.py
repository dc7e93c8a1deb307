"""Throughput (img/s at a batch size) and latency (ms at batch 1) of the model forward.

Only the forward is timed, in ``eval()`` and ``torch.inference_mode()``, on a seeded input on
the device, after discarded warm-up iterations, synchronising before each clock read; the
result is the median over repeats and its interquartile spread, with the threads, usable cores
and load average around the timing. ``precision`` times under ``torch.autocast``. A timing is
doubted (:func:`timing_doubt`) when its spread exceeds :data:`SPREAD_LIMIT` of its median or
the load average exceeded the cores plus :data:`LOAD_MARGIN`. docs/measuring.md, "Throughput
and latency" and "Honest timings"."""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

import torch
from torch import nn

from vitbench.core import progress
from vitbench.core.option_values import MAX_REPEATS, QUICK_REPEATS, chosen_repeats  # noqa: F401 (re-exported)
from vitbench.measure.load import LOAD_MARGIN, MachineLoad, machine_load, wait_for_quiet, waiting_on
from vitbench.measure.precision import DEFAULT_PRECISION, autocast
from vitbench.measure._common import (
    check_input_size,
    check_int,
    check_model,
    check_model_on,
    eval_mode,
    median_and_iqr,
    batch_of,
    model_device_dtype,
    resolve_device,
    synchronize,
)

__all__ = [
    "LOAD_MARGIN", "MAX_REPEATS", "QUICK_REPEATS", "SPREAD_LIMIT", "LatencyResult", "MachineLoad",
    "ThroughputResult", "chosen_repeats", "default_warmup", "machine_load", "measure_latency",
    "measure_throughput", "quiet_timing", "timing_doubt",
]

#: a timing whose interquartile spread exceeds this fraction of its median is marked
SPREAD_LIMIT = 0.10
T = TypeVar("T", bound="_TimingFacts")


def timing_doubt(median: Optional[float], spread: Optional[float], load_before: Optional[float],
                 load_after: Optional[float], cores: Optional[int]) -> Optional[str]:
    """Why a timing is not to be trusted, in words, or None when it is (see the module
    docstring: spread above :data:`SPREAD_LIMIT` of the median, or load above cores +
    :data:`LOAD_MARGIN`). Missing facts (an old record) are not held against the timing."""
    reasons = []
    if median and spread is not None and spread / median > SPREAD_LIMIT:
        reasons.append(f"spread {100 * spread / median:.1f} % of the median "
                       f"(limit {100 * SPREAD_LIMIT:.0f} %)")
    loads = [x for x in (load_before, load_after) if x is not None]
    if cores and loads and max(loads) > cores + LOAD_MARGIN:
        shown = "/".join("n/a" if x is None else f"{x:.2f}" for x in (load_before, load_after))
        reasons.append(f"load average {shown} before/after above {cores} cores + {LOAD_MARGIN:g}")
    return "; ".join(reasons) or None


@dataclass(frozen=True, kw_only=True)
class _TimingFacts:
    """What a timing ran under (``load_before``, ``load_after``, ``cores``, ``threads`` fields of
    the result), kept in the record: the raw facts behind a report's mark."""

    load_before: Optional[float] = None
    load_after: Optional[float] = None
    cores: int = 0
    threads: int = 0
    #: seconds waited for a quiet machine before it (:func:`~vitbench.measure.load.wait_for_quiet`)
    waited_s: float = 0.0
    #: timed a second time because the first spread exceeded :data:`SPREAD_LIMIT` (this is the second)
    retimed: bool = False

    def _median_spread(self) -> tuple[float, float]:
        raise NotImplementedError

    @property
    def doubt(self) -> Optional[str]:
        """Why this timing is not to be trusted (:func:`timing_doubt`), or None."""
        return timing_doubt(*self._median_spread(), self.load_before, self.load_after, self.cores)

    def record_fields(self, prefix: str) -> dict[str, Any]:
        median, spread = self._median_spread()
        doubt = self.doubt
        return {
            f"{prefix}_load_before": self.load_before, f"{prefix}_load_after": self.load_after,
            f"{prefix}_cores": self.cores, f"{prefix}_threads": self.threads,
            f"{prefix}_spread_ratio": spread / median if median else None,
            f"{prefix}_flagged": doubt is not None, f"{prefix}_flag_reason": doubt,
            **({f"{prefix}_waited_s": round(self.waited_s, 1)} if self.waited_s else {}),
            **({f"{prefix}_retimed": True} if self.retimed else {}),
        }


@dataclass(frozen=True)
class ThroughputResult(_TimingFacts):
    """Images per second of the forward at ``batch_size``: median and IQR over ``repeats``, the
    same repeats as milliseconds per forward, and the machine's load before/after, cores and threads."""

    median_img_s: float
    spread_img_s: float
    batch_size: int
    repeats: int
    warmup: int
    median_ms: Optional[float] = None
    spread_ms: Optional[float] = None

    def _median_spread(self) -> tuple[float, float]:
        return self.median_img_s, self.spread_img_s

    def fields(self) -> dict[str, Any]:
        """The record fields (``throughput_*``): median, spread, repeats and the raw facts."""
        return {"throughput_img_s": self.median_img_s, "throughput_spread_img_s": self.spread_img_s,
                "throughput_repeats": self.repeats,
                **self.record_fields("throughput")}

    def curve_point(self) -> dict[str, Any]:
        """One point of a record's ``batch_curve`` (``--batch-sizes``): the batch size, images per
        second and milliseconds per forward (median and IQR), and why the timing is doubted, if it is."""
        return {"batch_size": self.batch_size, "throughput_img_s": self.median_img_s,
                "throughput_spread_img_s": self.spread_img_s, "latency_ms": self.median_ms,
                "latency_spread_ms": self.spread_ms, "flag_reason": self.doubt}


@dataclass(frozen=True)
class LatencyResult(_TimingFacts):
    """Milliseconds per forward at batch 1: median and IQR over ``repeats``, and the machine's
    load before/after, cores and threads."""

    median_ms: float
    spread_ms: float
    repeats: int
    warmup: int

    def _median_spread(self) -> tuple[float, float]:
        return self.median_ms, self.spread_ms

    def fields(self) -> dict[str, Any]:
        """The record fields (``latency_*``): median, spread, repeats and the raw facts."""
        return {"latency_ms": self.median_ms, "latency_spread_ms": self.spread_ms,
                "latency_repeats": self.repeats,
                **self.record_fields("latency")}


def default_warmup(repeats: int, device: str | torch.device = "cpu") -> int:
    """Warm-up iterations used when none are given (docs/measuring.md, "Throughput and latency")."""
    quarter = math.ceil(repeats / 4)
    return max(2, quarter) if torch.device(device).type == "cpu" else max(10, quarter)


def timed_forward(model: nn.Module, x: torch.Tensor, device: torch.device) -> float:
    """Seconds of one forward of ``model`` on ``x``, the device synchronised before each clock read."""
    synchronize(device)
    start = time.perf_counter()
    model(x)
    synchronize(device)
    return max(time.perf_counter() - start, 1e-12)  # guard a 0.0 clock delta


def timing_input(models: tuple[nn.Module, ...], batch_size: int, input_size: tuple[int, int, int],
                 device: str | torch.device, warmup: int | None, repeats: int, repeats_name: str = "repeats",
                 images: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.device, int]:
    """The input batch every model of ``models`` is timed on (``images`` taken in turn, else
    seeded noise: :func:`~vitbench.measure._common.batch_of`), the device and the warm-up
    (:func:`default_warmup` for None), after checking each argument and that every model is on
    the device (ParamError otherwise)."""
    for model in models:
        check_model(model, allow_compiled=True)  # --compile times the compiled model
    check_int("batch_size", batch_size, 1)
    size = check_input_size(input_size)
    check_int(repeats_name, repeats, 1)
    dev = resolve_device(device)
    warmup = default_warmup(repeats, dev) if warmup is None else check_int("warmup", warmup, 0)
    for model in models:
        check_model_on(model, dev)
    _, dtype = model_device_dtype(models[0])
    return batch_of(images, batch_size, size, dtype=dtype, device=dev), dev, warmup


def _time_forwards(
    model: nn.Module, batch_size: int, input_size: tuple[int, int, int], device: str | torch.device,
    warmup: int | None, repeats: int, precision: str = DEFAULT_PRECISION, what: str = "timing",
    images: Optional[torch.Tensor] = None,
) -> tuple[list[float], int, MachineLoad, MachineLoad]:
    """Seconds of each of ``repeats`` timed forwards (after warm-up, in ``precision``), the
    warm-up used, and the machine's load just before the warm-up and just after the last repeat.
    Warm-up and repeats are a :mod:`vitbench.core.progress` step ``what``, reported between clock reads."""
    x, dev, warmup = timing_input((model,), batch_size, input_size, device, warmup, repeats, images=images)

    seconds: list[float] = []
    before = machine_load()
    with eval_mode(model), torch.inference_mode(), autocast(precision, dev), \
            progress.steps(what, warmup + repeats, "forwards", timing=True) as step:
        for _ in range(warmup):
            model(x)
            step.advance()
        for _ in range(repeats):
            seconds.append(timed_forward(model, x, dev))
            step.advance()
    return seconds, warmup, before, machine_load()


def quiet_timing(time_it: Callable[[], T], what: str) -> T:
    """``time_it()`` once the machine is quiet (:func:`~vitbench.measure.load.wait_for_quiet`); in a
    run that waits, timed once more (after another wait) when its spread exceeded
    :data:`SPREAD_LIMIT`, the second result kept. The result says how long it waited and whether
    it was timed again."""
    waited = wait_for_quiet(what)
    result = time_it()
    median, spread = result._median_spread()
    if waiting_on() and median and spread / median > SPREAD_LIMIT:
        waited += wait_for_quiet(what)
        result = dataclasses.replace(time_it(), retimed=True)
    return dataclasses.replace(result, waited_s=waited) if waited else result


def _facts(before: MachineLoad, after: MachineLoad) -> dict[str, Any]:
    return {"load_before": before.load_1min, "load_after": after.load_1min, "cores": before.cores,
            "threads": before.threads}


def measure_throughput(
    model: nn.Module, batch_size: int, input_size: tuple[int, int, int] = (3, 224, 224),
    device: str | torch.device = "cpu", warmup: int | None = None, repeats: int = 10,
    precision: str = DEFAULT_PRECISION, images: Optional[torch.Tensor] = None,
) -> ThroughputResult:
    """Forward throughput in images per second at ``batch_size`` (median and IQR over repeats).

    ``warmup=None`` uses :func:`default_warmup`. ``images`` ``[m, C, H, W]``: the batch is these
    taken in turn (real images, so that an input-dependent method chooses as it does on data),
    else seeded noise. Raises ParamError for ``batch_size < 1``, ``repeats < 1``, ``warmup < 0``,
    a bad ``input_size`` or ``images``, or a model on another device.
    """
    what = f"timing throughput (batch {batch_size})"

    def once() -> ThroughputResult:
        seconds, used_warmup, before, after = _time_forwards(model, batch_size, input_size, device, warmup, repeats,
                                                             precision, what, images)
        return throughput_of(seconds, batch_size, used_warmup, before, after)

    return quiet_timing(once, what)


def throughput_of(seconds: list[float], batch_size: int, warmup: int, before: MachineLoad,
                  after: MachineLoad) -> ThroughputResult:
    """The :class:`ThroughputResult` of timed passes of ``seconds`` each over batches of ``batch_size``."""
    median, spread = median_and_iqr([batch_size / s for s in seconds])
    median_ms, spread_ms = median_and_iqr([s * 1e3 for s in seconds])
    return ThroughputResult(median_img_s=median, spread_img_s=spread, batch_size=batch_size, repeats=len(seconds),
                            warmup=warmup, median_ms=median_ms, spread_ms=spread_ms, **_facts(before, after))


def measure_latency(
    model: nn.Module, input_size: tuple[int, int, int] = (3, 224, 224),
    device: str | torch.device = "cpu", warmup: int | None = None, repeats: int = 10,
    precision: str = DEFAULT_PRECISION, images: Optional[torch.Tensor] = None,
) -> LatencyResult:
    """Forward latency at batch 1 in milliseconds (median and IQR over repeats), in ``precision``,
    on the first of ``images`` when given (:func:`measure_throughput`)."""
    what = "timing latency (batch 1)"

    def once() -> LatencyResult:
        seconds, used_warmup, before, after = _time_forwards(model, 1, input_size, device, warmup, repeats, precision,
                                                             what, images)
        median, spread = median_and_iqr([s * 1e3 for s in seconds])
        return LatencyResult(median_ms=median, spread_ms=spread, repeats=repeats, warmup=used_warmup,
                             **_facts(before, after))

    return quiet_timing(once, what)
