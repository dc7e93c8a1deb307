"""The dense fine-tuning protocol: what trains while a learnable method is fine-tuned inside a
trained detector (docs/measuring.md, "Accuracy and mAP").

A reducing backbone changes the maps the detector's neck and heads see, so the papers fine-tune
the whole detector with it. ``all`` (the default): the method's parameters and every detector
weight train, BatchNorm statistics updated. ``heads``: the method, the neck and the heads; the
backbone's weights and statistics stay bitwise the baseline's. ``method``: only the method's
parameters; everything else frozen. When detector weights train, the method's last stage runs
at least :data:`DENSE_EPOCHS` epochs (``--finetune-epochs``: another number, the control's too)
and detector weights train at :data:`DETECTOR_LR`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from vitbench.errors import VitbenchError, choices_error
from vitbench.task import CONTROL  # the control row: here the baseline detector fine-tuned as a method's is

if TYPE_CHECKING:  # the report reads this module's words without importing torch
    from torch import nn

__all__ = ["CONTROL", "DEFAULT_PROTOCOL", "DENSE_EPOCHS", "DETECTOR_LR", "PROTOCOLS", "DenseFinetune",
           "check_finetune_epochs", "check_protocol", "dense_finetune_for", "detector_parameters"]

#: what trains besides the method: everything, neck + heads, nothing
PROTOCOLS = ("all", "heads", "method")
DEFAULT_PROTOCOL = "all"
#: the fewest epochs of the method's last stage when detector weights train (the baseline's own)
DENSE_EPOCHS = {"det": 8, "seg": 4}
#: the detector weights' learning rate in the dense fine-tuning (half the default training's)
DETECTOR_LR = 1e-3
#: the name prefix of detector weights in the optimiser's parameter dict (its lr group key)
DETECTOR_PREFIX = "detector."
#: BatchNorm statistics per protocol
BN_STATS = {"all": "updated", "heads": "frozen in the backbone, updated in the neck and heads",
            "method": "frozen"}


def check_protocol(name: str) -> str:
    """``name`` when it is a protocol, else a clear error listing the valid ones."""
    if name not in PROTOCOLS:
        raise choices_error("dense fine-tuning protocol", name, PROTOCOLS)
    return name


@dataclass(frozen=True)
class DenseFinetune:
    """One run's dense fine-tuning settings (recorded as ``dense_finetune`` in its record)."""

    protocol: str = DEFAULT_PROTOCOL
    epochs: int = 0  # minimum epochs of the method's last stage (0: the method's own)
    detector_lr: float = DETECTOR_LR

    def __post_init__(self) -> None:
        check_protocol(self.protocol)

    @property
    def trains_detector(self) -> bool:
        return self.protocol != "method"

    def record(self) -> dict[str, Any]:
        """What the run record keeps (and the report states)."""
        out: dict[str, Any] = {"protocol": self.protocol, "bn_stats": BN_STATS[self.protocol]}
        if self.trains_detector:
            out.update(min_epochs=self.epochs, detector_lr=self.detector_lr)
        return out


def check_finetune_epochs(epochs: Optional[int]) -> Optional[int]:
    """``epochs`` when it is ``None`` (the task's :data:`DENSE_EPOCHS`) or an integer >= 1, else a
    clear error."""
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise VitbenchError(f"--finetune-epochs {epochs!r} is out of range; it must be an integer >= 1")
    return epochs


def dense_finetune_for(task: str, protocol: str, epochs: Optional[int] = None) -> DenseFinetune:
    """The settings of ``protocol`` on ``task`` (``det`` or ``seg``): the control's epochs and the
    fewest of a method's last stage are ``epochs``, else the task's :data:`DENSE_EPOCHS`."""
    check_protocol(protocol)
    if protocol == "method":
        return DenseFinetune("method", epochs=0)
    epochs = check_finetune_epochs(epochs) or DENSE_EPOCHS[task]
    return DenseFinetune(protocol, epochs=epochs, detector_lr=DETECTOR_LR)


def detector_parameters(detector: "nn.Module", protocol: str) -> dict[str, "nn.Parameter"]:
    """The detector weights ``protocol`` trains besides the method's own parameters, keyed
    ``detector.<name>`` (never a method parameter: those are the stage's to choose)."""
    check_protocol(protocol)
    out: dict[str, "nn.Parameter"] = {}
    if protocol == "method":
        return out
    for name, p in detector.named_parameters():
        if ".reducer." in f".{name}":
            continue
        if protocol == "heads" and name.startswith("backbone.model."):
            continue
        out[f"{DETECTOR_PREFIX}{name}"] = p
    return out


def stage_for(stage: Any, settings: DenseFinetune, last: bool) -> Any:
    """``stage`` as the dense fine-tuning runs it: detector weights at their own learning rate
    (first lr group), and the last stage for at least ``settings.epochs`` epochs."""
    if not settings.trains_detector:
        return stage
    epochs = max(stage.epochs, settings.epochs) if last and stage.epochs > 0 else stage.epochs
    return dataclasses.replace(stage, epochs=epochs,
                               lr_groups=((DETECTOR_PREFIX, settings.detector_lr), *stage.lr_groups))


def describe(settings: Optional[dict[str, Any]], with_method: bool = True) -> str:
    """The report's words for a recorded ``dense_finetune`` (``with_method=False``: the control's,
    which trains the detector weights alone)."""
    if not settings:
        return "method parameters only (detector frozen)"
    protocol = settings.get("protocol")
    what = {"all": "every detector weight (backbone, neck, heads)",
            "heads": "neck and heads (backbone frozen)"}.get(str(protocol), str(protocol))
    if protocol == "method":
        what = "method parameters only (detector frozen)"
    elif with_method:
        what = f"method parameters + {what}"
    out = f"`{protocol}`: {what}; BatchNorm statistics {settings.get('bn_stats', 'n/a')}"
    if protocol != "method" and settings.get("detector_lr") is not None:
        out += (f"; detector weights at lr {settings['detector_lr']:g}, the method's last stage "
                f"at least {settings.get('min_epochs')} epoch(s)")
    return out
