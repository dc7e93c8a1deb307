"""The ``det`` and ``seg`` tasks' own ``vitbench run``/``sweep`` options
(:attr:`vitbench.catalog.TaskSpec.options`; the CLI refuses them with ``--task cls``)."""
from __future__ import annotations

import argparse

from vitbench.plan import CONTROL

__all__ = ["add_dense_options"]


def add_dense_options(group: argparse._ArgumentGroup) -> None:
    """``--detector-epochs``, ``--dense-finetune``, ``--no-control`` and ``--detector-width``."""
    group.add_argument("--detector-epochs", type=int, default=None, metavar="N",
                       help="epochs of the baseline detector's default training (trained once, cached; "
                            "default: det 8, seg 4)")
    group.add_argument("--dense-finetune", default=None, metavar="all|heads|method",
                       help="what fine-tunes beside a learnable method: all (default; the whole "
                            "detector, as the papers), heads (neck and heads; backbone frozen) or method "
                            "(the method's parameters only)")
    group.add_argument("--no-control", action="store_true",
                       help=f"leave out the {CONTROL} row (the baseline detector fine-tuned like the "
                            "learnable methods' detectors, without a method; added by default when a learnable "
                            "method fine-tunes detector weights)")
    group.add_argument("--detector-width", default=None, choices=("full", "light"),
                       help="the detector's neck/head widths (default: light on the embedded data, "
                            "full with --data)")
