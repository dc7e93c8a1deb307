"""The metric names vitbench measures (``--metrics``), and which of them need labelled data.

The bottom of the layers (docs/architecture.md, "The layers"): the host checks a task's declared
metrics against these names, and the plan, the tasks and the CLI offer them.
"""
from __future__ import annotations

__all__ = ["DATA_METRICS", "DEFAULT_METRICS", "METRICS", "OPT_IN_METRICS"]

#: every metric name, in the report's order
METRICS = ("accuracy", "gmacs", "params", "throughput", "latency", "memory", "ib", "train_throughput")
#: metrics measured only when ``--metrics`` names them (the training step's throughput: it trains a copy)
OPT_IN_METRICS = ("train_throughput",)
#: what a task measures without ``--metrics``
DEFAULT_METRICS = tuple(m for m in METRICS if m not in OPT_IN_METRICS)
#: metrics that need labelled evaluation data
DATA_METRICS = ("accuracy", "ib")
