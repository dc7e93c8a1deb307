"""Option lists given as comma-separated text: split, stripped, each checked against the choices."""
from __future__ import annotations

import pytest

from vitbench.errors import UnknownNameError
from vitbench.core.options import parse_list


def test_a_comma_list_is_split_and_checked():
    assert parse_list("metric", " gmacs, params ,", ("gmacs", "params", "ib")) == ("gmacs", "params")
    with pytest.raises(UnknownNameError, match=r"^unknown metric 'flops'; valid metrics: gmacs, params$"):
        parse_list("metric", "gmacs,flops", ("gmacs", "params"))


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_the_commands_flags_are_made_from_the_options_fields(command):
    """Each field of RunOptions with a Flag is one flag of the commands it names, with its help;
    nothing else but the task's own flags (and run's --visualize) is added."""
    import dataclasses

    from vitbench.cli.main import build_parser
    from vitbench.core.options import FLAG, RunOptions
    from vitbench.host import get_host
    from vitbench.task import option_flags

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    flags = {a.option_strings[0]: a for a in sub._actions if a.option_strings and a.dest != "help"}
    declared = {f.metadata[FLAG].flag_of(f.name): f for f in dataclasses.fields(RunOptions)
                if FLAG in f.metadata and command in f.metadata[FLAG].commands}
    tasks = {flag for task in get_host().catalogs["tasks"].values() for flag in option_flags(task)}
    assert set(flags) - tasks - {"--visualize"} == set(declared)
    for flag, f in declared.items():
        assert flags[flag].dest == f.name and flags[flag].help.split()[:1] == f.metadata[FLAG].help.split()[:1]
        assert "{" not in flags[flag].help  # every placeholder filled


def test_a_parsed_command_line_is_the_options_the_api_takes():
    from vitbench.cli.main import build_parser
    from vitbench.cli.run_cmd import run_options
    from vitbench.core.options import RunOptions

    args = build_parser().parse_args(["sweep", "--methods", "tome", "--budgets", "0.9,0.5", "--no-controls",
                                      "--launcher", "none", "--repeats", "5", "--batch-sizes", "4,1"])
    assert run_options(args, "cls") == RunOptions(methods=("tome",), budgets=(0.9, 0.5), controls=False,
                                                  repeats=5, batch_sizes=(4, 1), task_options={"img_size": None})
