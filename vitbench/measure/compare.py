"""Speed-up and efficiency of a method against its baseline (docs/measuring.md, "Throughput").

Both are plain ratios, kept here so every report computes them the same way. The inputs must
come from the same process configuration and session (docs/measuring.md); these functions cannot
check that, the caller must.
"""
from __future__ import annotations

from vitbench.measure._common import check_positive_finite

__all__ = ["efficiency", "speedup"]


def speedup(method_img_s: float, baseline_img_s: float) -> float:
    """Throughput speed-up of a method: ``method_img_s / baseline_img_s`` (> 1 is faster)."""
    method = check_positive_finite("method_img_s", method_img_s)
    baseline = check_positive_finite("baseline_img_s", baseline_img_s)
    return method / baseline


def efficiency(speedup: float, baseline_gmacs: float, method_gmacs: float) -> float:
    """How much of the GMACs reduction became time: ``speedup / (baseline_gmacs / method_gmacs)``.

    1.0 means every saved MAC turned into time; below 1.0 the method's overhead (or a lost
    fused kernel) eats part of the saving; above 1.0 it saves more time than MACs (e.g. memory
    traffic). docs/measuring.md, "Throughput and latency", quotes a measured value.
    """
    s = check_positive_finite("speedup", speedup)
    base = check_positive_finite("baseline_gmacs", baseline_gmacs)
    method = check_positive_finite("method_gmacs", method_gmacs)
    return s / (base / method)
