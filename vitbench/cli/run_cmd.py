"""``vitbench run``: parse the options and hand them to :func:`vitbench.api.run` (plan, execute,
store and report), then print the summary.

``vitbench run --task cls --methods M1,M2 [--model NAME] [--data PATH|fashion-mnist]
[--param METHOD.KEY=VALUE ...] [--metrics ...] [--batch-size B] [--batch-sizes B1,B2,...] [--device cpu|cuda] [--seed S | --seeds S1,S2,...]
[--out DIR] [--resume] [--match-gmacs F] [--quick | --repeats N] [--launcher none|pytorch|slurm]``. The
baseline always runs too. Bad input exits 2 before anything runs. Progress goes to stderr through
:mod:`vitbench.core.progress`: bars with the time left on a terminal, plain lines elsewhere, nothing on a
rank > 0. ``--match-gmacs F`` puts every method at F x the baseline's GMACs (:mod:`vitbench.measure.calibrate`);
``vitbench sweep`` (:mod:`vitbench.cli.sweep_cmd`) shares these options and :func:`run`.
"""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from vitbench.cli.task_options import OwnedOption, add_task_options, check_task_options
from vitbench.errors import VitbenchError
from vitbench.core.metrics import METRICS
from vitbench.core.option_values import chosen_repeats
from vitbench.core.options import FLAG, FLAG_GROUPS, RunOptions
from vitbench.run.plan import parse_batch_sizes, parse_param_overrides, parse_seeds
from vitbench.host import distributed, get_host
from vitbench.tasks.embedded import DEFAULT_MODEL, EMBEDDED_TRAIN_LIMIT
from vitbench.api import run as run_benchmark
from vitbench.cli.visualize_cmd import check_run_visualize, visualize_run
from vitbench.core import progress


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run methods against the baseline and write runs.jsonl + report.md")
    groups = add_run_options(p, "run")
    groups["run"].add_argument("--visualize", action="store_true",
                   help="also draw which patches each method merged or pruned (docs/visualize.md) into OUT")
    p.set_defaults(handler=run)


def add_run_options(parser: argparse.ArgumentParser, command: str) -> dict[str, Any]:
    """``command``'s flags (``run`` or ``sweep``), made from the fields of
    :class:`~vitbench.core.options.RunOptions` and their :class:`~vitbench.core.options.Flag`, in
    ``--help``'s groups, then each task's own; returns the groups by key for a command's own flags."""
    groups = {key: parser.add_argument_group(title) for key, title in FLAG_GROUPS}
    words = {"tasks": ", ".join(get_host().names("tasks")), "default_model": DEFAULT_MODEL,
             "metrics": ",".join(METRICS), "train_limit": EMBEDDED_TRAIN_LIMIT[DEFAULT_MODEL]}
    for f in fields(RunOptions):
        flag = f.metadata.get(FLAG)
        if flag is None or command not in flag.commands:
            continue
        how: dict[str, Any] = {"help": flag.help.format(**words), "dest": f.name}
        if flag.action is not None:
            how["action"] = flag.action
        if flag.action == "append":
            how["default"] = []
        elif flag.action is None:
            how["default"] = f.default
        how.update({k: v for k, v in (("metavar", flag.metavar), ("choices", flag.choices)) if v is not None})
        if flag.required:
            how["required"] = True
        groups[flag.group].add_argument(flag.flag_of(f.name), **how)
    add_task_options(parser)  # each task's own, in a group per task (det/seg: --detector-epochs ...)
    return groups


def run(args: argparse.Namespace) -> int:
    """``vitbench run`` (and ``vitbench sweep``): the options as :class:`~vitbench.core.options.RunOptions`,
    run by :func:`vitbench.api.run`; print the summary table and the report's paths."""
    task = get_host().task(args.task)  # unknown -> error listing the registered tasks
    check_task_options(args, task.name)  # another task's option (--detector-epochs with cls) is refused
    options = run_options(args, task.name)
    if getattr(args, "visualize", False):
        check_run_visualize(args, task.name)  # another task or a non-ViT model: refused before the run
    quiet = distributed.launcher_rank(options.launcher) != 0  # ranks > 0 stay silent; rank 0 reports for all
    with progress.reporting(progress.sink_for(quiet=quiet)):  # bars on a terminal, else plain lines
        results = run_benchmark(options)
    if results.report is None:
        return 0  # an empty shard, or a rank other than 0
    if results.options.is_sweep:
        _print_sweep_summary(results.records, results.report, list(results.plots))  # this plan's: its data, its budgets
        _print_warnings(results.report)
    else:
        _print_summary(results.records, results.report, list(results.plots))
        _print_warnings(results.report)
        if getattr(args, "visualize", False):
            visualize_run(results)
    return 0 if results.ok else 1


def run_options(args: argparse.Namespace, task: str) -> RunOptions:
    """The parsed command line as typed options: each :class:`~vitbench.core.options.RunOptions`
    field from its flag (the lists' text parsed: methods, metrics, ``--param``, seeds, batch sizes), the options of ``task`` alone as its ``task_options``."""
    if args.metrics is not None and not _names(args.metrics):
        raise VitbenchError(f"--metrics {args.metrics!r} names no metric; valid metrics of --task {task}: "
                            f"{', '.join(get_host().task(task).info.metrics)} (or leave --metrics out for all)")
    parse = {"methods": _names, "metrics": _names, "params": parse_param_overrides, "seeds": parse_seeds,
             "batch_sizes": parse_batch_sizes,
             "repeats": lambda text: chosen_repeats(args.quick, text)}
    given = {f.name: getattr(args, f.name) for f in fields(RunOptions) if FLAG in f.metadata and hasattr(args, f.name)}
    values = {name: parse[name](value) if name in parse and value is not None else value
              for name, value in given.items()}
    owned: dict[str, OwnedOption] = getattr(args, "task_options", {}) or {}
    return RunOptions(**values, task_options={dest: getattr(args, dest) for dest, option in owned.items()
                                              if task in option.tasks})


def _names(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _print_warnings(report: Path) -> None:
    """The report's warnings, last, where a terminal reader sees them (:mod:`vitbench.report.warnings_of`)."""
    import sys

    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.warnings_of import report_warnings

    for text in report_warnings(report):
        print(f"vitbench: warning: {text}", file=sys.stderr)


def _print_summary(records: list, md: Path, pngs: list) -> None:  # type: ignore[type-arg]
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.tables import comparison_table

    first = records[0]
    table = comparison_table(records, first["task"], first["model"])
    failed = [r for r in records if r["status"] == "error"]
    if table.empty:
        print(f"no run finished: {len(failed)} of {len(records)} failed")
    else:
        print(table.to_markdown(index=False))
    for r in failed:
        print(f"FAILED {r.get('label') or r['method']}: {r.get('error')}")
    print(f"\nreport: {md}" + "".join(f"\nplot:   {png}" for png in pngs))


def _print_sweep_summary(records: list, md: Path, pngs: list) -> None:  # type: ignore[type-arg]
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.sweep import summary_table
    from vitbench.report.tables import groups

    for task, model in groups(records):
        print(f"{task} · {model}")
        print(summary_table(records, task, model).to_markdown(index=False, disable_numparse=True))
    print(f"\nreport: {md}")
    for png in pngs:
        print(f"plot:   {png}")
