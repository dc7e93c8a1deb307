"""Measurement layer: GMACs, parameters, throughput, latency, peak memory, speed-up/efficiency.

One function per metric, independent of tasks, each measuring the way docs/measuring.md says
(see the docstring of each module for the method and the reasons behind it).
"""
from __future__ import annotations

from vitbench.measure.compare import efficiency, speedup
from vitbench.measure.flops import GmacsResult, attention_flop_formulas, count_gmacs, count_gmacs_at
from vitbench.measure.memory import measure_peak_memory
from vitbench.measure.params import count_params_m
from vitbench.measure.speed import (
    LatencyResult,
    ThroughputResult,
    default_warmup,
    measure_latency,
    measure_throughput,
)

__all__ = [
    "GmacsResult",
    "LatencyResult",
    "ThroughputResult",
    "attention_flop_formulas",
    "count_gmacs",
    "count_gmacs_at",
    "count_params_m",
    "default_warmup",
    "efficiency",
    "measure_latency",
    "measure_peak_memory",
    "measure_throughput",
    "speedup",
]
