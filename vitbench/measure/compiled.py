"""``--compile``: time the ``torch.compile``d model (docs/measuring.md, "Throughput and latency").

The compiled model is what the timing loops (throughput, latency, peak memory) run; GMACs are
counted, and accuracy evaluated, on the eager model (compilation changes neither the MACs nor,
beyond float rounding, the logits). Compilation happens at the first call, so
:func:`compile_for_timing` makes that call itself, on an input of the timing's shape, under the
timing's precision: a model that does not compile (a method whose forward torch.compile cannot
trace) is then timed eagerly instead, and the reason is returned for the record -- the run is
measured, and says how.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from vitbench.measure._common import random_images
from vitbench.measure.precision import autocast

__all__ = ["CompiledForTiming", "compile_for_timing"]


@dataclass
class CompiledForTiming:
    """The module the timing loops run, and what to record about it."""

    module: nn.Module
    compiled: bool
    fallback: Optional[str] = None  # why the eager model is timed instead

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"compiled": self.compiled}
        if self.fallback:
            out["compile_fallback"] = self.fallback
        return out


def compile_for_timing(model: nn.Module, input_size: tuple[int, int, int], batch_sizes: tuple[int, ...],
                       device: str | torch.device, precision: str = "fp32") -> CompiledForTiming:
    """``torch.compile(model)``, already compiled for each of ``batch_sizes`` (the timing loops'
    shapes), or ``model`` itself with the reason when compilation fails."""
    compiled = torch.compile(model)
    # tome, ppt and top-k compile to one graph per model; a method with a graph break has its
    # blocks' frames compiled apart, one variant per block whose reducer settings differ, and
    # dynamo's default limit of 8 would leave the deeper blocks eager. Raised for the process, as
    # later calls of the timing loops may compile too.
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, 4 * sum(1 for _ in model.modules()))
    try:
        with torch.inference_mode(), autocast(precision, device):
            for batch in dict.fromkeys(batch_sizes):
                compiled(random_images(batch, input_size, dtype=torch.float32, device=torch.device(device)))
    except Exception as exc:  # noqa: BLE001 - any compiler failure: time the eager model, say why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return CompiledForTiming(model, False, f"torch.compile failed ({type(exc).__name__}: {first[:200]}); "
                                               f"timed eagerly")
    return CompiledForTiming(compiled, True)
