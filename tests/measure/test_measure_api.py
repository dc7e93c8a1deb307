"""The package re-exports its public API."""
from __future__ import annotations

import vitbench.measure as measure


def test_every_public_name_resolves() -> None:
    for name in measure.__all__:
        assert getattr(measure, name) is not None
    assert {"count_gmacs", "count_params_m", "measure_throughput", "measure_latency",
            "measure_peak_memory", "speedup", "efficiency", "GmacsResult", "ThroughputResult",
            "LatencyResult"} <= set(measure.__all__)
