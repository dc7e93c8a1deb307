"""Tasks register like methods (issue 13, item 1): the built-in ``cls``, ``det`` and ``seg`` are
task plugins, ``vitbench plugins`` and ``vitbench list tasks`` show them, and the example plugin's
``agreement`` task runs end to end through its real entry point."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from vitbench.catalog import ReportColumn, TaskSetup
from vitbench.cli.main import main
from vitbench.errors import UnknownNameError
from vitbench.hookspecs import hookimpl
from vitbench.host import PluginHost, get_host
from vitbench.task import Task, TaskInfo, compute_key

FAST = ["--model", "test_vit", "--param", "tome.r=4", "--param", "random-drop.layers=(1,3)", "--batch-size", "2"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_plugins_json_lists_the_tasks_and_their_plugins(capsys):
    assert main(["plugins", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    owners = {t["name"]: t["plugin"] for t in info["tasks"]}
    assert {"cls": "cls_task", "det": "dense_tasks", "seg": "dense_tasks"}.items() <= owners.items()
    assert owners["agreement"] == "example_random_drop"
    options = {t["name"]: t["options"] for t in info["tasks"]}
    assert options["det"] == options["seg"] == ["--detector-epochs", "--dense-finetune",
                                                "--finetune-epochs", "--no-control", "--detector-width"]
    assert options["cls"] == ["--img-size"] and options["agreement"] == ["--agreement-top"]
    registered = {p["name"]: p["registered"]["tasks"] for p in info["plugins"]}
    assert registered["cls_task"] == ["cls"] and registered["dense_tasks"] == ["det", "seg"]
    assert registered["tome"] == []
    assert main(["plugins"]) == 0
    text = capsys.readouterr().out
    assert any(line.startswith("dense_tasks ") and line.endswith("tasks: det, seg") for line in text.splitlines())


def test_list_tasks_names_each_task_with_its_plugin(capsys):
    assert main(["list", "tasks"]) == 0
    entries = capsys.readouterr().out.replace("\n    ", " ")  # entries wrap at 100 columns
    lines = {line.split()[0]: line for line in entries.splitlines()}
    assert {"cls", "det", "seg", "agreement"} <= set(lines)
    assert "plugin: cls_task" in lines["cls"] and "plugin: dense_tasks" in lines["seg"]
    assert "control row" in lines["det"] and "control row" not in lines["cls"]
    assert "backbone's GMACs" in lines["det"] and "model's GMACs" in lines["cls"]
    assert "options: --detector-epochs, --dense-finetune" in lines["seg"] and "options: --img-size" in lines["cls"]


def test_an_unknown_task_lists_the_registered_ones():
    with pytest.raises(UnknownNameError, match="unknown task 'nope'; valid tasks: agreement, cls, det, seg"):
        get_host().task("nope")


def test_the_example_task_runs_end_to_end(tmp_path, capsys):
    """``vitbench run --task agreement --methods tome``: the example plugin's task through its
    entry point, the generic plan, executor, store and report."""
    out = tmp_path / "out"
    assert main(["run", "--task", "agreement", "--methods", "tome,random-drop", *FAST, "--out", str(out)]) == 0
    base, tome, drop = _records(out)
    assert [r["method"] for r in (base, tome, drop)] == ["baseline", "tome", "random-drop"]
    assert all(r["status"] == "ok" and r["task"] == "agreement" for r in (base, tome, drop))
    assert base["agreement_pct"] == 100.0 and 0.0 <= tome["agreement_pct"] <= 100.0
    assert base["num_images"] == 64 and tome["images"] == "seeded noise"
    assert tome["gmacs"] < base["gmacs"] and drop["gmacs"] < base["gmacs"]
    report = (out / "report.md").read_text()
    assert "Agreement (%)" in report and "ΔAgreement (pp)" in report and "tome (r=4" in report
    assert "| Top-1 (%)" not in report and "| Box mAP" not in report
    assert "Agreement (%)" in capsys.readouterr().out.splitlines()[0]


def test_the_example_task_matches_compute_through_its_counter(tmp_path):
    out = tmp_path / "out"
    assert main(["run", "--task", "agreement", "--methods", "tome", "--model", "test_vit", "--match-gmacs", "0.7",
                 "--metrics", "gmacs", "--out", str(out)]) == 0
    base, tome = _records(out)
    assert tome["status"] == "ok" and tome["budget"]["counted"] == "model"
    assert tome["budget"]["landed_within"] and abs(tome["gmacs"] / base["gmacs"] - 0.7) <= 0.02 * 0.7


def test_the_example_task_refuses_a_learnable_method_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--task", "agreement", "--methods", "tome,ltm", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "task 'agreement' runs training-free methods only; ltm must be fine-tuned" in err
    assert not out.exists()


def _task(name: str, options=None, old: Optional[dict] = None, **info) -> Task:
    """A minimal task named ``name`` declaring ``info`` (:class:`TaskInfo`'s fields); ``options(group)``
    adds its flags; ``old``: class attributes of the contract before ``TaskInfo``."""
    def setup(self, options):
        return TaskSetup(model="m", data=None, metrics=("gmacs",))

    methods = {"setup": setup, "workspace": lambda self, request: None, "run": lambda self, *a: {}}
    if options is not None:
        methods["add_options"] = lambda self, group: options(group)
    return type(f"Task_{name}", (Task,), {"name": name, "info": TaskInfo(description=name, **info), **(old or {}),
                                          **methods})()


def test_a_task_with_an_unknown_metric_is_a_plugin_failure(capsys):
    class Plugin:
        @hookimpl
        def vitbench_register_tasks(self, register):
            register(_task("bad-task", metrics=("gmacs", "speed")))

    host = PluginHost()
    host.add_plugin(Plugin(), "bad_task_plugin")
    assert host.names("tasks") == []
    assert host.failures[0].name == "bad_task_plugin"
    assert "declares the metrics 'speed'; valid metrics: accuracy," in host.failures[0].error


def test_a_task_written_for_the_old_contract_is_a_plugin_failure_naming_the_new_place():
    class Plugin:
        @hookimpl
        def vitbench_register_tasks(self, register):
            register(_task("old-task", metrics=("gmacs",), old={"gmacs_counter": lambda self, *a: None}))

    host = PluginHost()
    host.add_plugin(Plugin(), "old_task_plugin")
    assert host.names("tasks") == []
    assert ("task 'old-task' defines gmacs_counter, which vitbench no longer reads; it is now the workspace's "
            "gmacs_of (docs/guide/task-plugins.md)") in host.failures[0].error


def test_a_duplicate_task_name_names_both_plugins():
    from vitbench.errors import PluginError

    class One:
        @hookimpl
        def vitbench_register_tasks(self, register):
            register(_task("twin", metrics=("gmacs",)))

    host = PluginHost()
    host.add_plugin(One(), "second")
    host.add_plugin(One(), "first")
    assert host.names("tasks") == ["twin"]  # a clash is a warning: the first by name keeps it
    assert [vars(c) for c in host.clashes] == [
        {"kind": "tasks", "name": "twin", "kept_by": "first", "refused_from": "second"}]
    with pytest.raises(PluginError, match="task 'twin' is registered by more than one plugin: 'first', 'second'; "
                                          "choose one: uninstall one of them, or set VITBENCH_DISABLE_PLUGINS=second"):
        host.task("twin")


def test_a_task_spec_checks_what_it_counts():
    with pytest.raises(UnknownNameError, match="unknown counted part 'detector'; valid counted parts: model, backbone"):
        _task("x", metrics=(), counts="detector")
    column = ReportColumn("k", "K", "ΔK")
    assert column.axis == "K" and compute_key(_task("y", metrics=(), counts="backbone")) == "backbone_gmacs"


def test_a_task_adds_its_own_options_and_other_tasks_refuse_them(tmp_path, capsys):
    """``TaskInfo.options``: the example task's ``--agreement-top K`` reaches its run (with K
    the number of classes every image agrees), is listed under its task in ``--help``, and is
    refused by name with another task, as det/seg's own options are with cls."""
    out = tmp_path / "out"
    assert main(["run", "--task", "agreement", "--methods", "tome,random-drop", *FAST, "--param", "random-drop.keep=0.2",
                 "--metrics", "accuracy", "--agreement-top", "1000", "--out", str(out)]) == 0
    base, _, drop = _records(out)
    assert base["agreement_top"] == drop["agreement_top"] == 1000
    assert drop["agreement_pct"] == 100.0  # test_vit has 1000 classes: the reference is always in the top 1000
    for task, flag, owners in (("cls", "--agreement-top", "agreement"), ("agreement", "--detector-width", "det, seg"),
                               ("cls", "--no-control", "det, seg")):
        value = [] if flag == "--no-control" else ["3" if flag == "--agreement-top" else "light"]
        assert main(["run", "--task", task, "--methods", "tome", flag, *value, "--out", str(tmp_path / "no")]) == 2
        assert f"{flag} is an option of --task {owners}; --task is '{task}'" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "options of --task det, seg:" in text and "options of --task agreement:" in text


def test_a_task_whose_options_break_is_a_plugin_failure_and_the_others_still_parse(monkeypatch, capsys):
    """A plugin task whose ``options`` raises (or clashes with an option vitbench has) is reported
    as a broken plugin; what it added is removed and every other option still parses."""
    import vitbench.host
    from vitbench.cli.main import build_parser

    def clashing(group):
        group.add_argument("--clash-extra", type=int, default=0)
        group.add_argument("--limit", type=int)  # vitbench's own option: argparse refuses it

    class Plugin:
        @hookimpl
        def vitbench_register_tasks(self, register):
            register(_task("clashing-task", metrics=("gmacs",), options=clashing))

    host = get_host()
    host.add_plugin(Plugin(), "clashing_plugin")
    monkeypatch.setattr(vitbench.host, "_HOST", host)
    args = build_parser().parse_args(["run", "--methods", "tome", "--detector-width", "light", "--limit", "3"])
    assert (args.detector_width, args.limit) == ("light", "3")  # integers are checked by run_options
    assert not hasattr(args, "clash_extra") and "clash_extra" not in args.task_options
    err = capsys.readouterr().err
    assert "plugin 'clashing_plugin'" in err and "the options of task(s) clashing-task could not be added" in err
    assert "--limit" in err
