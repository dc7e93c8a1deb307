"""The options of one benchmark (``vitbench run``/``sweep``, :func:`vitbench.benchmark`) as a typed record.

The CLI parses its flags into a :class:`RunOptions`; the Python API builds one from keywords.
The number options are checked here, once, whether they come as the command line's text or as
the API's values (:mod:`vitbench.core.option_values`); names (methods, metrics, the task's
options) are checked where they are known (the plan, the task), so bad input fails the same way
from both sides.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Union

from vitbench.core.option_values import (
    MAX_BATCH_SIZE, check_fraction, checked_budgets, checked_integer, checked_seconds,
)
from vitbench.errors import VitbenchError, choices_error

__all__ = ["RunOptions", "option_names", "parse_list"]


@dataclass(frozen=True)
class RunOptions:
    """Every option of ``vitbench run`` and ``vitbench sweep``, by its argparse dest name."""

    #: the task's name (``vitbench list tasks``)
    task: str = "cls"
    #: method names (``vitbench list methods``); the baseline always runs too
    methods: tuple[str, ...] = ()
    #: timm model name; ``None``: the task's default model
    model: Optional[str] = None
    #: data folder or embedded set name; ``None``: the task's default
    data: Optional[str] = None
    #: method parameters: ``{"tome": {"r": 8}}`` (typed, or ``--param``'s strings), or ``{"tome": ToMeParams(r=8)}``
    params: Mapping[str, Any] = field(default_factory=dict)
    #: metric names; ``None``: every metric the task measures
    metrics: Optional[tuple[str, ...]] = None
    #: throughput batch size
    batch_size: int = 32
    #: also time throughput and latency at each of these batch sizes (the speed-up curve); ``None``: not
    batch_sizes: Optional[tuple[int, ...]] = None
    #: ``cpu`` or ``cuda``
    device: str = "cpu"
    #: the one seed of every run (``None``: 0); exclusive with ``seeds``
    seed: Optional[int] = None
    #: run every spec once per seed
    seeds: Optional[tuple[int, ...]] = None
    #: result directory; ``None``: ``runs/<task>-<model>`` (``runs/sweep-...`` for a sweep)
    out: Union[str, Path, None] = None
    #: skip finished runs of the store, retry failed ones
    resume: bool = False
    #: load timm's pretrained weights
    pretrained: bool = False
    #: local weights file
    checkpoint: Optional[str] = None
    #: re-head the model for this many classes
    num_classes: Optional[int] = None
    #: evaluate only the first N images
    limit: Optional[int] = None
    #: learnable methods: train the backbone too
    train_backbone: bool = False
    #: learnable methods: fine-tune on the first N training images
    train_limit: Optional[int] = None
    #: ``fp32``, ``fp16`` or ``bf16``
    precision: str = "fp32"
    #: loader worker processes (``--workers N``); ``None``: half the usable cores for decoded data, 0 in memory
    workers: Optional[int] = None
    #: time the ``torch.compile``'d model
    compile: bool = False
    #: time a CUDA graph of the forward
    cuda_graph: bool = False
    #: repeats of each timing, throughput and latency (``--repeats N``); ``None``: the task's (10 and 20)
    repeats: Optional[int] = None
    #: a fast look: every timing with ``QUICK_REPEATS`` repeats (``--quick``); exclusive with ``repeats``
    quick: bool = False
    #: ``(I, N)``: run the I-th of N parts of the plan
    shard: Optional[tuple[int, int]] = None
    #: ``none``, ``pytorch`` or ``slurm``
    launcher: str = "none"
    #: every method at this fraction of the baseline's GMACs (``vitbench run --match-gmacs``)
    match_gmacs: Optional[float] = None
    #: every method at each of these fractions (``vitbench sweep --budgets``); a sweep when set
    budgets: Optional[tuple[float, ...]] = None
    #: a sweep also runs the controls that apply to the model (``--no-controls``: not)
    controls: bool = True
    #: run each spec in a process of its own (``--isolate``; vitbench.run.isolate)
    isolate: bool = False
    #: the most seconds one isolated run may take (``--run-timeout``; implies ``isolate``)
    run_timeout: Optional[float] = None
    #: the task's own options by dest name, e.g. ``{"detector_epochs": 4}``
    task_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check (and type) the number options, given as values or as the command line's text;
        refuse what no later check would see: an empty name or path (``--model ""`` would mean
        the default model, ``--out ""`` the current folder) and an empty metric list."""
        for name, (low, high) in _INTEGERS.items():
            object.__setattr__(self, name, checked_integer(f"--{name.replace('_', '-')}", getattr(self, name),
                                                           low, high))
        if self.match_gmacs is not None:
            object.__setattr__(self, "match_gmacs", check_fraction(self.match_gmacs))
        if self.budgets is not None:
            object.__setattr__(self, "budgets", checked_budgets(self.budgets))
        object.__setattr__(self, "run_timeout", checked_seconds("--run-timeout", self.run_timeout))
        for name, (what, default) in _TEXT_OPTIONS.items():
            value = getattr(self, name)
            if isinstance(value, str) and not value.strip():
                raise VitbenchError(f"--{name} {value!r} is empty; give {what}, or leave the option out "
                                    f"({default})")
        if self.metrics is not None and not any(str(m).strip() for m in self.metrics):
            raise VitbenchError(f"--metrics {','.join(map(str, self.metrics))!r} names no metric; give "
                                f"comma-separated metric names (`vitbench list tasks` lists each task's), or "
                                f"leave --metrics out for all of them")

    @property
    def isolated(self) -> bool:
        """Each spec in a process of its own: ``--isolate``, or implied by ``--run-timeout``."""
        return self.isolate or self.run_timeout is not None

    @property
    def is_sweep(self) -> bool:
        """A sweep (``budgets`` given): stored under ``runs/sweep-...``, always resumed, a sweep report."""
        return self.budgets is not None


#: the integer options and their ranges (``None``: no bound)
_INTEGERS: dict[str, tuple[Optional[int], Optional[int]]] = {
    "batch_size": (1, MAX_BATCH_SIZE), "seed": (None, None), "num_classes": (1, None), "limit": (1, None),
    "train_limit": (1, None), "workers": (0, None),
}

#: the text options an empty string is refused for, and what to give instead
_TEXT_OPTIONS = {"model": ("a model name (`vitbench list models`)", "the task's default model"),
                 "data": ("a data folder or an embedded set name", "the task's default data"),
                 "checkpoint": ("the path of a weights file", "no checkpoint"),
                 "out": ("a result folder", "runs/<task>-<model>")}


def option_names() -> tuple[str, ...]:
    """The names :class:`RunOptions` takes, in declaration order."""
    return tuple(f.name for f in fields(RunOptions))


def parse_list(kind: str, text: str, valid: Iterable[str]) -> tuple[str, ...]:
    """Split a comma list and check every item against ``valid``."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    valid = tuple(valid)
    for item in items:
        if item not in valid:
            raise choices_error(kind, item, valid)
    return items
