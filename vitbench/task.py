"""The task contract: one :class:`Task` subclass per task (``vitbench run --task NAME``), registered
through ``vitbench_register_tasks`` like a method (docs/architecture.md, "Tasks").

A task declares what it is in one :class:`TaskInfo` (metrics, accuracy columns, whose GMACs it
counts, its spec fields and options), names the model and data of a run (:meth:`Task.setup`),
loads what the runs share into a :class:`Workspace` and measures one run's reduced model
(:meth:`Task.run`): the executor copies the model and applies the method, so no task applies one
itself, and neither the plan nor the reports name a task. What it says in reports is the optional
:class:`TaskReport`; its command-line options are read off its options dataclass by
:func:`add_options`, :func:`option_flags` and :func:`option_names`.
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
    from torch import nn

    from vitbench.core.options import RunOptions

__all__ = ["BASELINE", "CONTROL", "REFERENCES", "NoOptions", "Progress", "Task", "TaskField", "TaskInfo",
           "TaskReport", "TaskSetup", "Workspace", "WorkspaceRequest", "add_options", "compute_key", "compute_name",
           "label_notes", "option", "option_flags", "option_names", "parse_options", "report_words"]

#: the unreduced model's row of every plan
BASELINE = "baseline"
#: the control row (:attr:`TaskInfo.control`): the baseline fine-tuned as a method's model is, no method
CONTROL = "baseline+ft"
#: the two rows that are no method (no plugin, no parameters)
REFERENCES = (BASELINE, CONTROL)

Progress = Callable[[str], None]


def option(help: str, *, default: Any = None, metavar: Optional[str] = None,
           choices: Optional[Sequence[str]] = None) -> Any:
    """A field of a task's options dataclass (:attr:`TaskInfo.options`) with its command-line help; the flag is the field's
    name with dashes (``detector_epochs`` -> ``--detector-epochs``), a ``bool`` field a switch."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "choices": choices})


@dataclass(frozen=True)
class NoOptions:
    """The options of a task that has none of its own."""


def _value_type(hint: Any) -> Any:
    """``Optional[int]`` -> ``int``: the type argparse converts a flag's value to."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


@dataclass(frozen=True)
class TaskField:
    """A task's own field of a run spec, hashed into its id when set (det: ``dense_finetune``), and
    how a label shows it: ``note`` formatted with the value (``"fine-tuned: {}"``; ``{s}``: an
    "s" unless the value is 1), except at
    ``unless`` (the default the label leaves out); no ``note``: the label does not show it.
    ``no_control``: its values under which a plan holds no :data:`CONTROL` row (det: ``method``,
    where no detector weight trains)."""

    name: str
    note: str = ""
    unless: Any = None
    no_control: tuple[Any, ...] = ()

    def label_note(self, value: Any) -> Optional[str]:
        """The label's note for ``value``, or ``None``."""
        if not self.note or value is None or value == self.unless:
            return None
        return self.note.format(value, s="" if value == 1 else "s")


@dataclass(frozen=True)
class TaskInfo:
    """What a task is, declared once (:attr:`Task.info`).

    ``metrics``: the ``--metrics`` names it measures (:data:`vitbench.core.metrics.METRICS`);
    ``accuracy``: its accuracy metrics as the reports show them, the headline first; ``counts``:
    whose GMACs a budget is matched on and the reports compare (:data:`~vitbench.catalog.COUNTED`);
    ``distributed``: its runs spread over ``torchrun`` processes (:mod:`vitbench.host.distributed`);
    ``control``: its plans hold the :data:`CONTROL` row when a method trains (unless its setup's
    ``control`` keyword is false); ``fields``: its own spec fields; ``options``: the dataclass of its
    own flags (fields made with :func:`option`)."""

    description: str
    metrics: tuple[str, ...]
    accuracy: tuple[ReportColumn, ...] = ()
    counts: str = "model"
    distributed: bool = False
    control: bool = False
    fields: tuple[TaskField, ...] = ()
    options: type = NoOptions

    def __post_init__(self) -> None:
        if self.counts not in COUNTED:
            raise UnknownNameError(f"unknown counted part {self.counts!r}; valid counted parts: {', '.join(COUNTED)}")
        if not dataclasses.is_dataclass(self.options):
            raise TypeError(f"a task's options must be a dataclass, not {self.options!r}")

    @property
    def field_names(self) -> tuple[str, ...]:
        """The names of :attr:`fields`."""
        return tuple(f.name for f in self.fields)


class Workspace:
    """What the runs of one plan share (:meth:`Task.workspace` returns one): a task's workspace
    dataclass inherits it and sets ``model`` (the unreduced model each run reduces a copy of);
    ``counters`` is the executor's cache of matched-compute counters, one per seed."""

    model: Any
    counters: dict

    def record_fields(self) -> dict[str, Any]:
        """What every record of the plan carries, failed runs' too (cls: the head fitted once)."""
        return {}

    def gmacs_of(self, spec: Any, progress: Progress) -> Optional[Callable[["nn.Module"], float]]:
        """The GMACs of a (reduced) copy of :attr:`model` as the task's reports count them, on the
        images ``spec``'s run counts on (``--match-gmacs``, sweeps); ``None``: it cannot match compute."""
        return None


class Task(ABC):
    """A task as a plugin registers it: subclass, set :attr:`name` and :attr:`info`, implement
    :meth:`setup`, :meth:`workspace` and :meth:`run`; register an instance with
    ``register(MyTask())`` in ``vitbench_register_tasks``. Mix in :class:`TaskReport` for words of
    its own in the reports."""

    #: ``vitbench run --task NAME``
    name: ClassVar[str] = ""
    #: what the task is: metrics, accuracy columns, counted part, spec fields, options
    info: ClassVar[TaskInfo] = TaskInfo(description="", metrics=())

    @abstractmethod
    def setup(self, options: "RunOptions") -> TaskSetup:
        """Check the options and name the model, data and metrics (cheap: nothing is loaded; bad
        input raises a :class:`~vitbench.errors.VitbenchError`)."""

    @abstractmethod
    def workspace(self, request: WorkspaceRequest) -> Workspace:
        """Load the model and data, check every method of the plan applies
        (:func:`vitbench.host.apply.check_applies`) and return what the runs share."""

    @abstractmethod
    def run(self, spec: Any, ws: Workspace, model: "nn.Module", progress: Progress) -> dict[str, Any]:
        """One run spec on ``model``: a copy of ``ws.model`` that the executor reduced with the
        spec's method (``reduction_context(model).params`` holds its parameters, a matched knob
        set; unreduced for the baseline and the control); fine-tune it when it trains, evaluate and
        measure; the fields returned go into the record. Raises on failure (the executor records it)."""


class TaskReport:
    """Optional: what a task says in the reports beyond its numbers (det: its fine-tuning protocol,
    its detector). Mix it into a :class:`Task` and override what applies; every method has a
    default that says nothing."""

    def compared_with_control(self, record: Mapping[str, Any]) -> bool:
        """Whether the report compares ``record`` with the :data:`CONTROL` row (its "vs +ft"
        delta): it trained what the control trained (det: detector weights)."""
        return False

    def training_words(self, record: Mapping[str, Any], with_method: bool = True) -> Optional[str]:
        """The report's words for what trained in a fine-tuned ``record`` besides the method
        (det: the dense fine-tuning protocol); ``None``: the report says whether the backbone trained."""
        return None

    def report_notes(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Sentences the report puts under a table of this task's rows (det: the detector and its
        training); ``[]``: none."""
        return []


def report_words(task: Task) -> TaskReport:
    """What ``task`` says in reports: the task itself when it mixes in :class:`TaskReport`,
    otherwise the defaults."""
    return task if isinstance(task, TaskReport) else TaskReport()


def parse_options(task: Task, values: Mapping[str, Any]) -> Any:
    """``values`` (``RunOptions.task_options``) as an instance of ``task``'s options dataclass; a
    missing name takes its default, an unknown one is refused naming the valid ones."""
    valid = [f.name for f in dataclasses.fields(task.info.options)]
    unknown = sorted(k for k in values if k not in valid)
    if unknown:
        raise VitbenchError(f"unknown option {unknown[0]!r} of task {task.name!r}; its options: "
                            f"{', '.join(valid) or '(none)'}")
    return task.info.options(**values)


def label_notes(task: Task, fields: Mapping[str, Any]) -> list[str]:
    """The notes a spec's label shows for its task ``fields`` (det: ``fine-tuned: heads``), in the
    order the task declares them; the control row's label is :data:`CONTROL` with these notes."""
    notes = (f.label_note(fields.get(f.name)) for f in task.info.fields)
    return [n for n in notes if n is not None]


def compute_key(task: Task) -> str:
    """The record field a budget is matched on and the sweep plots: ``gmacs`` or ``backbone_gmacs``."""
    return "gmacs" if task.info.counts == "model" else "backbone_gmacs"


def compute_name(task: Task) -> str:
    """``GMACs`` or ``backbone GMACs``: what :func:`compute_key` holds, in words."""
    return "GMACs" if task.info.counts == "model" else "backbone GMACs"


def add_options(task: Task, group: argparse._ArgumentGroup) -> None:
    """Add ``task``'s own ``vitbench run``/``sweep`` flags to ``group``, one per field of its
    options dataclass; refused by name with another ``--task``
    (:func:`vitbench.cli.task_options.check_task_options`). A task whose class defines
    ``add_options(group)`` adds its flags itself."""
    own = getattr(task, "add_options", None)
    if own is not None:
        own(group)
        return
    hints = typing.get_type_hints(task.info.options)
    for f in dataclasses.fields(task.info.options):
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
