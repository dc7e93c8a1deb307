"""The Python API (:mod:`vitbench.api`): ``vitbench.benchmark``/``sweep`` run what ``vitbench run``/``sweep``
run, with typed options, and return the records and the report's table."""
from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import vitbench
from vitbench.cli.main import build_parser, main
from vitbench.cli.run_cmd import run_options
from vitbench.errors import VitbenchError
from vitbench.core.options import RunOptions, option_names

DEIT = "deit_tiny_patch16_224"


def _stored(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_benchmark_gives_the_gmacs_and_spec_ids_of_vitbench_run(tmp_path):
    r = vitbench.benchmark(task="cls", model=DEIT, methods=["tome"], params={"tome": {"r": 8}}, metrics=["gmacs"],
                           out=tmp_path / "api")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", "--task", "cls", "--model", DEIT, "--methods", "tome", "--param", "tome.r=8",
                     "--metrics", "gmacs", "--out", str(tmp_path / "cli")]) == 0
    cli = _stored(tmp_path / "cli")
    assert [(x["spec_id"], x["gmacs"]) for x in r.records] == [(x["spec_id"], x["gmacs"]) for x in cli]
    assert [x["method"] for x in r.records] == ["baseline", "tome"] and r.records[1]["params"]["r"] == 8
    assert r.records == r.all_records == _stored(tmp_path / "api")
    assert r.ok and r.report == tmp_path / "api" / "report.md" and r.report.is_file()
    assert "vitbench.benchmark(task='cls'" in r.report.read_text()  # the call, as the report's command
    table = r.table()
    assert isinstance(table, pd.DataFrame)
    assert list(table["Method"]) == ["baseline", "tome (r=8)"]
    assert table.to_markdown(index=False) in printed.getvalue()  # the summary vitbench run prints


def test_an_unknown_option_names_the_valid_ones():
    with pytest.raises(VitbenchError, match=r"unknown option 'batchsize' of vitbench.benchmark; valid options: "
                                            r"task, methods, .*batch_size"):
        vitbench.benchmark(methods=["tome"], batchsize=4)
    with pytest.raises(VitbenchError, match="unknown option 'budgets' of vitbench.benchmark"):
        vitbench.benchmark(methods=["tome"], budgets=[0.5])  # a sweep's: vitbench.sweep
    with pytest.raises(VitbenchError, match="unknown option 'match_gmacs' of vitbench.sweep"):
        vitbench.sweep(methods=["tome"], budgets=[0.5], match_gmacs=0.5)


def test_bad_values_fail_as_on_the_command_line():
    with pytest.raises(VitbenchError, match="--methods is empty"):
        vitbench.benchmark(methods=[])
    with pytest.raises(VitbenchError, match="unknown task 'nope'"):
        vitbench.benchmark(task="nope", methods=["tome"])
    with pytest.raises(VitbenchError, match="unknown option 'detector_epochs' of task 'cls'"):
        vitbench.benchmark(methods=["tome"], task_options={"detector_epochs": 2})
    with pytest.raises(VitbenchError, match=r"--shard '3/2' is not I/N"):
        vitbench.benchmark(methods="tome", shard="3/2")  # the command line's forms are taken too
    with pytest.raises(VitbenchError, match="--seed 3 and --seeds 0,1 were both given"):
        vitbench.benchmark(model="test_vit", methods=["tome"], seed=3, seeds=[0, 1], metrics=["gmacs"])


@pytest.mark.parametrize("given, said", [
    ({"methods": 5}, "vitbench.benchmark: methods=5 is not a list of texts (the command line's --methods)"),
    ({"model": 42}, "vitbench.benchmark: model=42 is not a text or None (the command line's --model)"),
    ({"out": 123}, "vitbench.benchmark: out=123 is not a text or a path or None (the command line's --out)"),
    ({"limit": True}, "vitbench.benchmark: limit=True is not an integer or None"),
    ({"params": ["tome.r=8"]}, "vitbench.benchmark: params=['tome.r=8'] is not a mapping (the command line's "
                               "--param METHOD.KEY=VALUE)"),
    ({"seeds": "0,x"}, "vitbench.benchmark: seeds='0,x' is not a comma-separated list of integers"),
    ({"seeds": [0, "1"]}, "vitbench.benchmark: seeds=(0, '1') is not a list of integers or None"),
])
def test_a_wrong_type_is_one_line_naming_the_option(given, said):
    with pytest.raises(VitbenchError) as raised:
        vitbench.benchmark(**{"methods": ["tome"], **given})
    assert str(raised.value).startswith(said)


def test_seeds_as_text_are_the_command_lines_list_not_its_characters():
    from vitbench.api import _options

    assert _options("benchmark", {"methods": "tome", "seeds": "0,1"}, exclude=()).seeds == (0, 1)
    assert _options("sweep", {"methods": "tome", "budgets": "0.9,0.8"}, exclude=()).budgets == (0.9, 0.8)


@pytest.mark.parametrize("budgets", [None, (), "0.5"])
def test_a_sweep_without_budgets_is_refused(budgets):
    with pytest.raises(VitbenchError, match=re.escape(f"budgets={budgets!r}: a sweep needs a sequence of fractions")):
        vitbench.sweep(methods=["tome"], budgets=budgets)


def test_the_command_line_becomes_typed_options():
    args = build_parser().parse_args(["run", "--methods", "tome, topk", "--param", "tome.r=8", "--metrics",
                                      "gmacs,params", "--seeds", "0,2", "--shard", "1/2", "--match-gmacs", "0.5"])
    options = run_options(args, "cls")
    assert options == RunOptions(methods=("tome", "topk"), params={"tome": {"r": "8"}}, metrics=("gmacs", "params"),
                                 seeds=(0, 2), shard=(1, 2), match_gmacs=0.5, task_options={"img_size": None})
    det = run_options(build_parser().parse_args(["run", "--task", "det", "--methods", "tome",
                                                 "--detector-epochs", "2"]), "det")
    assert det.task_options["detector_epochs"] == 2 and not det.is_sweep
    sweep = run_options(build_parser().parse_args(["sweep", "--methods", "tome", "--budgets", "0.9,0.5"]), "cls")
    assert sweep.budgets == (0.9, 0.5) and sweep.is_sweep
    # --visualize draws a figure after the run (vitbench.visualize), it is not an option of the run
    parsed = set(vars(args)) - {"command", "handler", "param", "task_options", "visualize"} - set(args.task_options)
    assert parsed <= set(option_names())  # every run option has its typed field


@pytest.mark.slow
def test_sweep_returns_each_budgets_records_and_the_summary(tmp_path):
    """A matched budget counts GMACs once per knob value tried: slow on a loaded CPU."""
    r = vitbench.sweep(model="test_vit", methods="tome", budgets=[0.6], metrics=["gmacs"], out=tmp_path, controls=False)
    assert [(x["method"], x.get("match_gmacs")) for x in r.records] == [("baseline", None), ("tome", 0.6)]
    assert r.ok and r.report == tmp_path / "report.md" and {p.name for p in r.plots} >= {"pareto_gmacs.png"}
    table = r.table()
    assert list(table["Method"]) == ["tome"] and "F = 0.6" in table.columns


def test_import_vitbench_stays_cheap():
    code = "import sys, vitbench; vitbench.benchmark; print(sorted({'torch', 'pandas'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    import vitbench.api

    assert (vitbench.benchmark, vitbench.sweep, vitbench.Results, vitbench.RunOptions) == (
        vitbench.api.benchmark, vitbench.api.sweep, vitbench.api.Results, RunOptions)
    with pytest.raises(AttributeError, match="no attribute 'benchmarks'"):
        vitbench.benchmarks  # noqa: B018
