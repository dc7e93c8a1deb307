"""``vitbench sweep``: every method at every compute budget, into one store, with Pareto plots.

``vitbench sweep --task cls --methods M1,M2 --budgets 0.9,0.8,0.7 [the options of vitbench run]``
runs the baseline once and each method at each budget (its budget knob matched to that fraction
of the baseline's GMACs, :mod:`vitbench.measure.calibrate`), with the controls that apply to the
model (``random``, ``downsample``; ``--no-controls``: without), through the same plan, executor and store
as ``vitbench run``. A sweep always resumes: re-running it skips the runs already done and
retries failed ones. OUT/report.md holds one table per budget, a summary and the Pareto plots.
"""
from __future__ import annotations

import argparse

from vitbench.cli import run_cmd


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run every method at every compute budget (Pareto fronts), resumable")
    run_cmd.add_run_options(p, "sweep")
    p.set_defaults(handler=run_cmd.run)
