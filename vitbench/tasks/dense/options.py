"""The ``det`` and ``seg`` tasks' own ``vitbench run``/``sweep`` options
(:attr:`vitbench.task.TaskInfo.options`; the CLI refuses them with ``--task cls``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.task import CONTROL, option

__all__ = ["DenseOptions"]


@dataclass(frozen=True)
class DenseOptions:
    """``--detector-epochs``, ``--dense-finetune``, ``--finetune-epochs``, ``--no-control`` and
    ``--detector-width``."""

    detector_epochs: Optional[int] = option(
        "epochs of the baseline detector's default training (trained once, cached; default: 4 on the scenes, "
        "det 8 and seg 4 on shapes-coco and --data)",
        metavar="N")
    dense_finetune: Optional[str] = option(
        "what fine-tunes beside a learnable method: all (default; the whole detector, as the papers), heads "
        "(neck and heads; backbone frozen) or method (the method's parameters only)", metavar="all|heads|method")
    finetune_epochs: Optional[int] = option(
        f"epochs of the dense fine-tuning: the {CONTROL} control's, and the fewest of a learnable method's last "
        "stage (default: 1 on the scenes, det 8 and seg 4 on shapes-coco and --data); a longer method run is "
        "compared with a control trained as long", metavar="N")
    no_control: bool = option(
        f"leave out the {CONTROL} row (the baseline detector fine-tuned like the learnable methods' detectors, "
        "without a method; added by default when a learnable method fine-tunes detector weights)", default=False)
    detector_width: Optional[str] = option(
        "the detector's neck/head widths (default: light on the embedded data, full with --data)",
        choices=("full", "light"))
