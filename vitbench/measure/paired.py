"""A method's speed-up timed in turn with its baseline: paired rounds in one process.

Two throughputs taken minutes apart share no machine state: a shared VM's neighbours or the CPU's
clock can change between them by more than a method saves. Here each round times one forward of
the baseline and one of the reduced model on the same input, alternating which goes first, and
the speed-up is the median over rounds of the per-round ratio (baseline seconds / method
seconds), so a drift slower than a round cancels (docs/measuring.md, "Paired speed-ups").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from vitbench.core import progress
from vitbench.measure._common import eval_mode, median_and_iqr
from vitbench.measure.precision import DEFAULT_PRECISION, autocast
from vitbench.measure.speed import _TimingFacts, machine_load, quiet_timing, timed_forward, timing_input

__all__ = ["PAIRED_ROUNDS", "PairedSpeedup", "measure_paired_speedup"]

#: rounds of a speed-up timed in turn with the baseline (the report's speed-up column) by default
PAIRED_ROUNDS = 30


@dataclass(frozen=True)
class PairedSpeedup(_TimingFacts):
    """The median and IQR over ``rounds`` of the baseline's forward time over the method's, at
    ``batch_size``, and the machine's load before/after, cores and threads."""

    speedup: float
    spread: float
    batch_size: int
    rounds: int
    warmup: int

    def _median_spread(self) -> tuple[float, float]:
        return self.speedup, self.spread

    def fields(self) -> dict[str, Any]:
        """The record fields (``speedup``, ``speedup_*``): median, spread, rounds and the raw facts."""
        return {"speedup": self.speedup, "speedup_spread": self.spread, "speedup_rounds": self.rounds,
                "speedup_paired": True, **self.record_fields("speedup")}


def measure_paired_speedup(
    model: nn.Module, baseline: nn.Module, batch_size: int, input_size: tuple[int, int, int] = (3, 224, 224),
    device: str | torch.device = "cpu", warmup: int | None = None, rounds: int = 10,
    precision: str = DEFAULT_PRECISION, images: Optional[torch.Tensor] = None,
) -> PairedSpeedup:
    """``model``'s speed-up over ``baseline`` at ``batch_size``: per round one forward of each on
    the same input (``images`` taken in turn, else seeded noise:
    :func:`~vitbench.measure.speed.measure_throughput`), in alternating order; the median and IQR
    of baseline / method seconds.

    ``warmup=None`` uses :func:`~vitbench.measure.speed.default_warmup` forwards of each. Raises
    ParamError for a bad batch size, rounds, warm-up or input size, or a model on another device.
    """
    x, dev, warmup = timing_input((model, baseline), batch_size, input_size, device, warmup, rounds, "rounds",
                                  images)

    what = f"timing against the baseline (batch {batch_size})"

    def once() -> PairedSpeedup:
        ratios: list[float] = []
        before = machine_load()
        with eval_mode(model), eval_mode(baseline), torch.inference_mode(), autocast(precision, dev), \
                progress.steps(what, warmup + rounds, "rounds", timing=True) as step:
            for _ in range(warmup):
                baseline(x)
                model(x)
                step.advance()
            for i in range(rounds):
                if i % 2 == 0:
                    base_s = timed_forward(baseline, x, dev)
                    method_s = timed_forward(model, x, dev)
                else:
                    method_s = timed_forward(model, x, dev)
                    base_s = timed_forward(baseline, x, dev)
                ratios.append(base_s / method_s)
                step.advance()
        after = machine_load()
        median, spread = median_and_iqr(ratios)
        return PairedSpeedup(speedup=median, spread=spread, batch_size=batch_size, rounds=rounds, warmup=warmup,
                             load_before=before.load_1min, load_after=after.load_1min, cores=before.cores,
                             threads=before.threads)

    return quiet_timing(once, what)
