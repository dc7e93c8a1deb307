"""The metric names vitbench measures (``--metrics``), and which of them need labelled data.

The bottom of the layers (docs/architecture.md, "The layers"): the host checks a task's declared
metrics against these names, and the plan, the tasks and the CLI offer them.
"""
from __future__ import annotations

__all__ = ["DATA_METRICS", "METRICS"]

#: every metric name, in the report's order
METRICS = ("accuracy", "gmacs", "params", "throughput", "latency", "memory", "ib")
#: metrics that need labelled evaluation data
DATA_METRICS = ("accuracy", "ib")
