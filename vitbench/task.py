"""The task contract: one :class:`Task` subclass per task (``vitbench run --task NAME``), registered
through ``vitbench_register_tasks`` like a method (docs/architecture.md, "Tasks").

A task names its model, data and metrics from typed :class:`~vitbench.core.options.RunOptions`, builds
what the runs of a plan share, runs one spec, and declares what the plan needs to know of it (its
accuracy columns, whose GMACs it counts, its control row), so that neither the plan nor the reports
name a task. :class:`Task` is what a task must implement to run (seven methods, three of them
optional); what it says in reports is the optional :class:`TaskReport`; its command-line options
are read off its ``Options`` dataclass by :func:`add_options`, :func:`option_flags` and
:func:`option_names`.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from vitbench.catalog import COUNTED, ReportColumn, TaskSetup, WorkspaceRequest
from vitbench.errors import UnknownNameError, VitbenchError

if TYPE_CHECKING:  # pragma: no cover
    from vitbench.core.options import RunOptions

__all__ = ["BASELINE", "CONTROL", "REFERENCES", "NoOptions", "Progress", "Task", "TaskReport", "TaskSetup",
           "WorkspaceRequest", "add_options", "compute_key", "compute_name", "option", "option_flags", "option_names",
           "report_words"]

#: the unreduced model's row of every plan
BASELINE = "baseline"
#: the control row (:attr:`Task.control`): the baseline fine-tuned as a method's model is, no method
CONTROL = "baseline+ft"
#: the two rows that are no method (no plugin, no parameters)
REFERENCES = (BASELINE, CONTROL)

Progress = Callable[[str], None]


def option(help: str, *, default: Any = None, metavar: Optional[str] = None,
           choices: Optional[Sequence[str]] = None) -> Any:
    """A field of a task's ``Options`` dataclass with its command-line help; the flag is the field's
    name with dashes (``detector_epochs`` -> ``--detector-epochs``), a ``bool`` field a switch."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "choices": choices})


@dataclass(frozen=True)
class NoOptions:
    """The options of a task that has none of its own."""


def _value_type(hint: Any) -> Any:
    """``Optional[int]`` -> ``int``: the type argparse converts a flag's value to."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


class Task(ABC):
    """A task as a plugin registers it: subclass, set the class attributes, implement
    :meth:`setup`, :meth:`workspace` and :meth:`run` (and optionally :meth:`gmacs_counter`,
    :meth:`shared_fields`, :meth:`control_fields`); register an instance with
    ``register(MyTask())`` in ``vitbench_register_tasks``. Mix in :class:`TaskReport` for words of
    its own in the reports."""

    #: ``vitbench run --task NAME``
    name: ClassVar[str] = ""
    #: one line for ``vitbench list tasks``
    description: ClassVar[str] = ""
    #: the ``--metrics`` names the task measures (:data:`vitbench.core.metrics.METRICS`)
    metrics: ClassVar[tuple[str, ...]] = ()
    #: its accuracy metrics as the reports show them, the headline first
    accuracy: ClassVar[tuple[ReportColumn, ...]] = ()
    #: whose GMACs a budget is matched on and the reports compare (:data:`~vitbench.catalog.COUNTED`)
    counts: ClassVar[str] = "model"
    #: its runs can spread over ``torchrun`` processes (``--launcher pytorch``, :mod:`vitbench.host.distributed`)
    distributed: ClassVar[bool] = False
    #: its plans may hold the :data:`CONTROL` row (:meth:`control_fields` says when)
    control: ClassVar[bool] = False
    #: the task's own fields of a run spec, hashed into its id when set (det: ``dense_finetune``)
    spec_fields: ClassVar[tuple[str, ...]] = ()
    #: the dataclass of the task's own options (fields made with :func:`option`)
    Options: ClassVar[type] = NoOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.counts not in COUNTED:
            raise UnknownNameError(f"unknown counted part {cls.counts!r} of task {cls.name!r}; valid counted "
                                   f"parts: {', '.join(COUNTED)}")

    def parse_options(self, values: Mapping[str, Any]) -> Any:
        """``values`` (``RunOptions.task_options``) as an :attr:`Options` instance; a missing name
        takes its default, an unknown one is refused naming the valid ones."""
        valid = [f.name for f in dataclasses.fields(self.Options)]
        unknown = sorted(k for k in values if k not in valid)
        if unknown:
            raise VitbenchError(f"unknown option {unknown[0]!r} of task {self.name!r}; its options: "
                                f"{', '.join(valid) or '(none)'}")
        return self.Options(**values)

    # -- what a run does ----------------------------------------------------------------------
    @abstractmethod
    def setup(self, options: "RunOptions") -> TaskSetup:
        """Check the options and name the model, data and metrics (cheap: nothing is loaded; bad
        input raises a :class:`~vitbench.errors.VitbenchError`)."""

    @abstractmethod
    def workspace(self, request: WorkspaceRequest) -> Any:
        """Load the model and data, check every method of the plan applies
        (:func:`vitbench.host.apply.check_applies`) and return what the runs share: an object with
        ``model`` (the unreduced model every run reduces a copy of) and ``counters`` (a dict the
        executor caches matched-compute counters in, one per seed)."""

    @abstractmethod
    def run(self, spec: Any, ws: Any, values: Any, progress: Progress) -> dict[str, Any]:
        """One run spec: apply the method with ``values`` (its parameter dataclass, to pass to
        :func:`~vitbench.apply` as it is: ``spec.values``, or a copy with the budget knob matched;
        ``None`` for the baseline), fine-tune it when it trains, evaluate and measure; the fields
        returned go into the record. Raises on failure (the executor records the error)."""

    def gmacs_counter(self, spec: Any, ws: Any, progress: Progress) -> Any:
        """A :class:`~vitbench.measure.calibrate.GmacsCounter` of what :attr:`counts` names, on the images
        the run counts on (``--match-gmacs``, sweeps); ``None``: the task cannot match compute."""
        return None

    def shared_fields(self, ws: Any) -> dict[str, Any]:
        """What every record of the plan carries, failed runs' too (cls: the head fitted once)."""
        return {}

    # -- what the plan asks of the task --------------------------------------------------------
    def control_fields(self, fields: Mapping[str, Any]) -> Optional[dict[str, Any]]:
        """Given the task fields of a plan's learnable specs, the task fields of its control row,
        or ``None`` for none (asked only when :attr:`control` is set and a method trains)."""
        return None


class TaskReport:
    """Optional: what a task says in the reports beyond its numbers (det: its fine-tuning protocol,
    its detector). Mix it into a :class:`Task` and override what applies; every method has a
    default that says nothing."""

    def compared_with_control(self, record: Mapping[str, Any]) -> bool:
        """Whether the report compares ``record`` with the :data:`CONTROL` row (its "vs +ft"
        delta): it trained what the control trained (det: detector weights)."""
        return False

    def label_notes(self, fields: Mapping[str, Any]) -> list[str]:
        """The notes a spec's label shows for its task fields (det: ``fine-tuned: heads``); the
        control row's label is :data:`CONTROL` with these notes."""
        return []

    def training_words(self, record: Mapping[str, Any], with_method: bool = True) -> Optional[str]:
        """The report's words for what trained in a fine-tuned ``record`` besides the method
        (det: the dense fine-tuning protocol); ``None``: the report says whether the backbone trained."""
        return None

    def report_notes(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Sentences the report puts under a table of this task's rows (det: the detector and its
        training); ``[]``: none."""
        return []


_REPORT_HOOKS = tuple(name for name in vars(TaskReport) if not name.startswith("_"))


def report_words(task: Task) -> TaskReport:
    """What ``task`` says in reports: the task itself when it mixes in :class:`TaskReport`;
    otherwise the defaults, with any hook the task defines by the same name (tasks written when
    these hooks were :class:`Task` methods)."""
    if isinstance(task, TaskReport):
        return task
    words = TaskReport()
    for name in _REPORT_HOOKS:
        if hasattr(task, name):
            setattr(words, name, getattr(task, name))
    return words


def compute_key(task: Task) -> str:
    """The record field a budget is matched on and the sweep plots: ``gmacs`` or ``backbone_gmacs``."""
    return "gmacs" if task.counts == "model" else "backbone_gmacs"


def compute_name(task: Task) -> str:
    """``GMACs`` or ``backbone GMACs``: what :func:`compute_key` holds, in words."""
    return "GMACs" if task.counts == "model" else "backbone GMACs"


def add_options(task: Task, group: argparse._ArgumentGroup) -> None:
    """Add ``task``'s own ``vitbench run``/``sweep`` flags to ``group``, one per field of its
    ``Options``; refused by name with another ``--task``
    (:func:`vitbench.cli.task_options.check_task_options`). A task whose class defines
    ``add_options(group)`` adds its flags itself."""
    own = getattr(task, "add_options", None)
    if own is not None:
        own(group)
        return
    hints = typing.get_type_hints(task.Options)
    for f in dataclasses.fields(task.Options):
        flag, meta = "--" + f.name.replace("_", "-"), f.metadata
        kind = _value_type(hints[f.name])
        if kind is bool:
            group.add_argument(flag, action="store_true", default=f.default, help=meta.get("help"))
            continue
        extra = {k: meta[k] for k in ("metavar", "choices") if meta.get(k) is not None}
        group.add_argument(flag, type=kind, default=f.default, help=meta.get("help"), **extra)


def _option_actions(task: Task) -> list[argparse.Action]:
    group = argparse.ArgumentParser(add_help=False).add_argument_group()
    try:
        add_options(task, group)
    except Exception:  # noqa: BLE001 - listed as none; `vitbench run` names the failure
        return []
    return [a for a in group._group_actions if a.option_strings]


def option_flags(task: Task) -> tuple[str, ...]:
    """The flags :func:`add_options` adds for ``task`` (``("--detector-epochs", ...)``; ``()`` when
    it has none or they cannot be added: the CLI reports that as a broken plugin)."""
    return tuple(a.option_strings[0] for a in _option_actions(task))


def option_names(task: Task) -> tuple[str, ...]:
    """The names of ``task``'s own options (``RunOptions.task_options`` keys, argparse dests)."""
    return tuple(a.dest for a in _option_actions(task))
