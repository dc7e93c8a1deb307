"""The task contract (:class:`vitbench.Task`): a minimal subclass registered through
``vitbench_register_tasks`` runs end to end (options, plan with its spec fields and control row,
executor, store, report); its own options become flags and are parsed into its ``Options``."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

import vitbench
from vitbench.catalog import ReportColumn, TaskSetup
from vitbench.errors import UnknownNameError, VitbenchError
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host
from vitbench.task import (CONTROL, Task, TaskField, TaskInfo, TaskReport, Workspace, add_options, compute_key,
                           compute_name, label_notes, option, option_flags, option_names, parse_options, report_words)


@dataclass(frozen=True)
class EchoOptions:
    """The test task's own options."""

    echo_scale: float = option("what every run's score is multiplied by", default=1.0, metavar="S")
    echo_mode: Optional[str] = option("how the control is planned", choices=("ctl", "none"))
    echo_quiet: bool = option("print nothing", default=False)


@dataclass
class EchoWorkspace(Workspace):
    """What the runs share: the model the executor reduces (timm's tiny ``test_vit``; the score
    does not read it) and the executor's counter cache."""

    scale: float
    model: Any = None
    counters: dict = field(default_factory=dict)


class EchoTask(Task):
    """A task that measures nothing: each run's score is its method's name length x the scale."""

    name = "echo"
    info = TaskInfo(description="test: a score per method", metrics=("accuracy",),
                    accuracy=(ReportColumn("score", "Score", "ΔScore", ".1f"),), control=True,
                    fields=(TaskField("echo_mode", note="mode: {}"),), options=EchoOptions)

    def setup(self, options):
        own = parse_options(self, options.task_options)
        return TaskSetup(model="echo-model", data=None, metrics=("accuracy",),
                         plan={"echo_mode": own.echo_mode, "control": own.echo_mode == "ctl"})

    def workspace(self, request):
        import timm

        return EchoWorkspace(parse_options(self, request.options.task_options).echo_scale,
                             model=timm.create_model("test_vit"))

    def run(self, spec, ws, model, progress):
        reduced = getattr(model, "_vitbench_context", None) is not None
        return {"score": len(spec.method) * ws.scale, "echo_mode_seen": spec.echo_mode, "reduced": reduced}


class EchoPlugin:
    @hookimpl
    def vitbench_register_tasks(self, register):
        register(EchoTask())


@pytest.fixture
def echo_host():
    """The process-wide host with the test task's plugin added (the next test gets a fresh host)."""
    host = get_host()
    host.add_plugin(EchoPlugin(), "echo_plugin")
    return host


def test_a_task_subclass_runs_end_to_end_through_the_hook(echo_host, tmp_path):
    """Registered through the hook, the task's options reach its setup and workspace, its spec
    field reaches the learnable specs and its control row, its notes show in the labels."""
    assert isinstance(echo_host.task("echo"), vitbench.Task)
    results = vitbench.benchmark(task="echo", methods=["tome", "ltm"], out=tmp_path / "out",
                                 task_options={"echo_scale": 2.0, "echo_mode": "ctl"})
    by_method = {r["method"]: r for r in results.records}
    assert list(by_method) == ["baseline", CONTROL, "tome", "ltm"]
    assert all(r["status"] == "ok" for r in results.records)
    assert by_method["tome"]["score"] == 8.0 and by_method["baseline"]["score"] == 16.0
    assert by_method["ltm"]["echo_mode_seen"] == "ctl" and by_method["tome"]["echo_mode_seen"] is None
    # the executor reduced the methods' copies, not the references'
    assert [r["reduced"] for r in results.records] == [False, False, True, True]
    assert by_method["ltm"]["label"] == "ltm (ratio=0.7, mode: ctl)" and by_method[CONTROL]["label"] == f"{CONTROL} (mode: ctl)"
    assert list(results.table()["Score"]) == ["16.0", "22.0", "8.0", "6.0"]
    assert "ΔScore" in results.report.read_text()


def test_a_setup_that_says_no_control_plans_none(echo_host, tmp_path):
    results = vitbench.benchmark(task="echo", methods=["ltm"], out=tmp_path / "out",
                                 task_options={"echo_mode": "none"})
    assert [r["method"] for r in results.records] == ["baseline", "ltm"]


def test_an_unknown_task_option_names_the_valid_ones(echo_host, tmp_path):
    with pytest.raises(VitbenchError, match="unknown option 'echo_volume' of task 'echo'; its options: "
                                            "echo_scale, echo_mode, echo_quiet"):
        vitbench.benchmark(task="echo", methods=["tome"], out=tmp_path / "out", task_options={"echo_volume": 3})
    assert not (tmp_path / "out").exists()
    assert parse_options(EchoTask(), {"echo_scale": 3.0}) == EchoOptions(echo_scale=3.0)


def test_the_options_dataclass_becomes_typed_flags():
    task = EchoTask()
    assert option_flags(task) == ("--echo-scale", "--echo-mode", "--echo-quiet")
    assert option_names(task) == ("echo_scale", "echo_mode", "echo_quiet")
    parser = argparse.ArgumentParser()
    add_options(task, parser.add_argument_group())
    args = parser.parse_args(["--echo-scale", "0.5", "--echo-mode", "ctl", "--echo-quiet"])
    assert (args.echo_scale, args.echo_mode, args.echo_quiet) == (0.5, "ctl", True)
    assert vars(parser.parse_args([])) == {"echo_scale": 1.0, "echo_mode": None, "echo_quiet": False}
    with pytest.raises(SystemExit):
        parser.parse_args(["--echo-mode", "other"])


def test_a_task_declares_what_it_counts_and_has_defaults():
    with pytest.raises(UnknownNameError, match="unknown counted part 'detector'; valid counted parts: model, backbone"):
        TaskInfo(description="bad", metrics=(), counts="detector")
    with pytest.raises(TypeError, match="a task's options must be a dataclass"):
        TaskInfo(description="bad", metrics=(), options=dict)
    task = EchoTask()
    ws = EchoWorkspace(1.0)
    assert ws.gmacs_of(None, print) is None and ws.record_fields() == {}
    words = report_words(task)  # EchoTask mixes in no TaskReport: the defaults
    assert words.training_words({}) is None and words.report_notes([]) == [] and not words.compared_with_control({})
    assert label_notes(task, {"echo_mode": "ctl"}) == ["mode: ctl"] and label_notes(task, {}) == []
    assert (compute_key(task), compute_name(task)) == ("gmacs", "GMACs")
    with pytest.raises(TypeError):
        Task()  # setup, workspace and run are abstract


def test_a_label_note_leaves_out_the_default():
    field_ = TaskField("protocol", note="fine-tuned: {}", unless="all")
    assert [field_.label_note(v) for v in ("all", "heads", None)] == [None, "fine-tuned: heads", None]
    assert TaskField("quiet").label_note("x") is None
    epochs = TaskField("epochs", note="fine-tuned {} epoch{s}")
    assert [epochs.label_note(n) for n in (1, 16)] == ["fine-tuned 1 epoch", "fine-tuned 16 epochs"]


def test_the_task_contract_has_at_most_8_public_members():
    """What a task declares and implements (Task) and what it may say in reports (TaskReport):
    8 public members together; the rest is the workspace's and module functions'."""
    task_members = sorted(n for n in vars(Task) if not n.startswith("_"))
    report_members = sorted(n for n in vars(TaskReport) if not n.startswith("_"))
    assert task_members == ["info", "name", "run", "setup", "workspace"]
    assert report_members == ["compared_with_control", "report_notes", "training_words"]

    class Worded(EchoTask, TaskReport):
        def report_notes(self, rows):
            return [f"{len(rows)} rows"]

    assert report_words(Worded()).report_notes([{}]) == ["1 rows"]
