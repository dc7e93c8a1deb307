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
from vitbench.task import (CONTROL, Task, TaskReport, add_options, compute_key, compute_name, option, option_flags,
                           option_names, report_words)


@dataclass(frozen=True)
class EchoOptions:
    """The test task's own options."""

    echo_scale: float = option("what every run's score is multiplied by", default=1.0, metavar="S")
    echo_mode: Optional[str] = option("how the control is planned", choices=("ctl", "none"))
    echo_quiet: bool = option("print nothing", default=False)


@dataclass
class EchoWorkspace:
    """What the runs share: no model is needed, only the executor's counter cache."""

    scale: float
    model: Any = None
    counters: dict = field(default_factory=dict)


class EchoTask(Task):
    """A task that measures nothing: each run's score is its method's name length x the scale."""

    name = "echo"
    description = "test: a score per method"
    metrics = ("accuracy",)
    accuracy = (ReportColumn("score", "Score", "ΔScore", ".1f"),)
    control = True
    spec_fields = ("echo_mode",)
    Options = EchoOptions

    def setup(self, options):
        own = self.parse_options(options.task_options)
        return TaskSetup(model="echo-model", data=None, metrics=("accuracy",),
                         plan={"echo_mode": own.echo_mode})

    def workspace(self, request):
        return EchoWorkspace(self.parse_options(request.options.task_options).echo_scale)

    def run(self, spec, ws, values, progress):
        return {"score": len(spec.method) * ws.scale, "echo_mode_seen": spec.echo_mode}

    def control_fields(self, fields):
        return {"echo_mode": fields["echo_mode"]} if fields.get("echo_mode") == "ctl" else None

    def label_notes(self, fields):
        return [f"mode: {fields['echo_mode']}"] if fields.get("echo_mode") else []


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
    assert by_method["ltm"]["label"] == "ltm (ratio=0.7, mode: ctl)" and by_method[CONTROL]["label"] == f"{CONTROL} (mode: ctl)"
    assert list(results.table()["Score"]) == ["16.0", "22.0", "8.0", "6.0"]
    assert "ΔScore" in results.report.read_text()


def test_without_its_control_fields_the_plan_has_no_control(echo_host, tmp_path):
    results = vitbench.benchmark(task="echo", methods=["ltm"], out=tmp_path / "out",
                                 task_options={"echo_mode": "none"})
    assert [r["method"] for r in results.records] == ["baseline", "ltm"]


def test_an_unknown_task_option_names_the_valid_ones(echo_host, tmp_path):
    with pytest.raises(VitbenchError, match="unknown option 'echo_volume' of task 'echo'; its options: "
                                            "echo_scale, echo_mode, echo_quiet"):
        vitbench.benchmark(task="echo", methods=["tome"], out=tmp_path / "out", task_options={"echo_volume": 3})
    assert not (tmp_path / "out").exists()
    assert EchoTask().parse_options({"echo_scale": 3.0}) == EchoOptions(echo_scale=3.0)


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
    with pytest.raises(UnknownNameError, match="unknown counted part 'detector' of task 'bad'"):
        type("Bad", (EchoTask,), {"name": "bad", "counts": "detector"})
    task = EchoTask()
    assert task.gmacs_counter(None, None, print) is None and task.shared_fields(None) == {}
    words = report_words(task)  # EchoTask defines label_notes alone, as a Task method
    assert words.training_words({}) is None and words.report_notes([]) == []
    assert words.label_notes({"echo_mode": "ctl"}) == ["mode: ctl"] and not words.compared_with_control({})
    assert (compute_key(task), compute_name(task)) == ("gmacs", "GMACs")
    with pytest.raises(TypeError):
        Task()  # setup, workspace and run are abstract


def test_the_run_contract_is_short_and_report_words_are_apart():
    """What a task must implement to run is at most 8 methods; the report's words are the
    optional TaskReport, which a task mixes in."""
    run_members = [name for name, value in vars(Task).items()
                   if callable(value) and not isinstance(value, type) and not name.startswith("_")]
    assert sorted(run_members) == ["control_fields", "gmacs_counter", "parse_options", "run", "setup",
                                   "shared_fields", "workspace"]
    assert not set(run_members) & set(vars(TaskReport))

    class Worded(EchoTask, TaskReport):
        def report_notes(self, rows):
            return [f"{len(rows)} rows"]

    assert report_words(Worded()).report_notes([{}]) == ["1 rows"]
    assert report_words(Worded()).label_notes({"echo_mode": "x"}) == ["mode: x"]  # EchoTask's, before TaskReport's
