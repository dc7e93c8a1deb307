"""The Python API: run a benchmark or a sweep as ``vitbench run``/``sweep`` do, from a notebook.

>>> r = vitbench.benchmark(task="cls", methods=["tome"], params={"tome": {"r": 8}})  # doctest: +SKIP
>>> r.table()  # the report's comparison table, the baseline first  # doctest: +SKIP

Both write the store and report.md under ``out`` and return :class:`Results`. The CLI builds a
:class:`~vitbench.core.options.RunOptions` from its flags and calls :func:`run` (docs/guide/run.md).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from vitbench.errors import VitbenchError
from vitbench.core.option_types import check_option_types, split_numbers
from vitbench.core.option_values import chosen_repeats
from vitbench.core.options import RunOptions, option_names
from vitbench.catalog import WorkspaceRequest
from vitbench.core import progress
from vitbench.data.workers import bounded_workers
from vitbench.host import distributed, get_host
from vitbench.host.allocator import keep_freed_memory
from vitbench.host.values import method_values
from vitbench.results import ResultStore
from vitbench.results.writable import OutputError, check_writable
from vitbench.run.isolate import Isolation
from vitbench.run.plan import method_names, plan_for

if TYPE_CHECKING:  # pandas comes with the report
    import pandas as pd

__all__ = ["Results", "benchmark", "run", "sweep"]

Record = dict[str, Any]
Names = Union[str, Sequence[str]]


@dataclass(frozen=True)
class Results:
    """What a benchmark or a sweep leaves: its records, the store's, and the report's paths."""

    options: RunOptions
    #: the result directory (store and report)
    out: Path
    #: this call's records, one per run of its plan in plan order (resumed ones read from the store)
    records: list[Record]
    #: every record of the store in ``out`` (earlier calls' too): what the report is written from
    all_records: list[Record]
    #: ``out/report.md``; ``None`` when nothing ran here (an empty shard, a rank other than 0)
    report: Optional[Path] = None
    #: the report's plots
    plots: tuple[Path, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every run finished (or was skipped) and is in the store: the CLI exits 0, else 1."""
        return all(r["status"] in ("ok", "skipped") and "rescued_to" not in r for r in self.records)

    def table(self) -> "pd.DataFrame":
        """This call's table: a benchmark's comparison table (the baseline first,
        :func:`~vitbench.report.tables.comparison_table`), a sweep's summary (one row per method,
        :func:`~vitbench.report.sweep.summary_table`). One call has one task and one model."""
        import pandas as pd

        if not self.records:
            return pd.DataFrame()
        task, model = self.records[0]["task"], self.records[0]["model"]
        if self.options.is_sweep:
            # the measuring stack: when a run starts; the command line starts light
            from vitbench.report.sweep import summary_table

            return summary_table(self.records, task, model)
        # the measuring stack: when a run starts; the command line starts light
        from vitbench.report.tables import comparison_table

        return comparison_table(self.records, task, model)


def benchmark(task: str = "cls", model: Optional[str] = None, methods: Names = (),
              params: Optional[Mapping[str, Mapping[str, Any]]] = None, metrics: Optional[Names] = None,
              out: Union[str, Path, None] = None, **options: Any) -> Results:
    """Run the baseline and ``methods`` on ``task`` as ``vitbench run`` does and return the results.

    ``methods`` and ``metrics`` are lists of names (or one comma-separated string); ``options``
    are the other ``vitbench run`` options by their dest names (``seeds=[0, 1]``,
    ``match_gmacs=0.6``, ``limit=256``, ``task_options={"detector_epochs": 4}``, ...;
    :class:`~vitbench.core.options.RunOptions`); an unknown name raises :class:`VitbenchError`."""
    given = dict(task=task, model=model, methods=methods, params=params, metrics=metrics, out=out, **options)
    return run(_options("benchmark", given, exclude=("budgets", "controls")), command=_call("benchmark", given))


def sweep(task: str = "cls", model: Optional[str] = None, methods: Names = (), budgets: Sequence[float] = (),
          params: Optional[Mapping[str, Mapping[str, Any]]] = None, metrics: Optional[Names] = None,
          out: Union[str, Path, None] = None, **options: Any) -> Results:
    """Run every method at every budget (fractions of the baseline's GMACs) as ``vitbench sweep`` does."""
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, Sequence) or not budgets:
        raise VitbenchError(f"budgets={budgets!r}: a sweep needs a sequence of fractions of the baseline's "
                            f"GMACs, each in (0, 1], e.g. budgets=[0.9, 0.8, 0.7]")
    given = dict(task=task, model=model, methods=methods, budgets=budgets, params=params, metrics=metrics,
                 out=out, **options)
    return run(_options("sweep", given, exclude=("match_gmacs",)), command=_call("sweep", given))


def _options(function: str, given: Mapping[str, Any], exclude: tuple[str, ...]) -> RunOptions:
    """``given`` keywords as RunOptions: sequences as tuples, ``"a,b"`` names and an ``"I/N"``
    shard as the command line writes them."""
    valid = [name for name in option_names() if name not in exclude]
    for name in given:
        if name not in valid:
            raise VitbenchError(f"unknown option {name!r} of vitbench.{function}; valid options: {', '.join(valid)}")
    values = {k: v for k, v in given.items() if v is not None}
    for name in ("methods", "metrics"):
        if isinstance(values.get(name), str):
            values[name] = [item.strip() for item in values[name].split(",") if item.strip()]
    for name, kind in (("seeds", int), ("budgets", float), ("batch_sizes", int)):
        if isinstance(values.get(name), str):  # "0,1" as --seeds 0,1, never its characters
            values[name] = split_numbers(function, name, values[name], kind)
    for name in ("methods", "metrics", "seeds", "budgets", "shard", "batch_sizes"):
        if name in values and isinstance(values[name], (list, tuple, range)):
            values[name] = tuple(values[name])
    check_option_types(function, values)
    return RunOptions(**values)


def _call(function: str, given: Mapping[str, Any]) -> list[str]:
    """The call as the report's command: ``vitbench.benchmark(task='cls', methods=['tome'])``."""
    shown = ", ".join(f"{k}={str(v) if isinstance(v, Path) else v!r}" for k, v in given.items()
                      if v is not None and v != ())
    return [f"vitbench.{function}({shown})"]


def run(options: RunOptions, command: Optional[Sequence[str]] = None) -> Results:
    """Run a benchmark (a sweep when ``options.budgets`` is set) for the task ``options.task``
    names: the task resolves its model and data and builds the workspace; the plan, the
    executor, the store and the report are the same for every task. ``command`` is the report's
    (default: ``vitbench`` and this process's arguments)."""
    # the measuring stack: when a run starts; the command line starts light
    from vitbench.engine import cpu_kernels
    from vitbench.host.environment import environment
    from vitbench.measure.load import waiting
    from vitbench.run.execute import execute_plan

    get_host().check_untouched()  # a plugin's change to vitbench that could not be undone: nothing runs
    task = get_host().task(options.task)  # unknown -> error listing the registered tasks
    methods = method_names(options)
    repeats = chosen_repeats(options.quick, options.repeats)  # --quick / --repeats N, checked before anything runs
    if options.isolated and options.launcher != "none":
        raise VitbenchError(f"--isolate runs each spec in a process of its own, which --launcher {options.launcher}'s "
                            f"process group cannot follow; isolate single-process runs only")
    distributed.check_launcher(options.launcher, task.name, methods)
    options = _with_bounded_workers(_with_parsed_params(options, methods))
    setup = task.setup(options)  # its own options checked (vitbench.task.parse_options)
    plan = plan_for(options, setup, repeats)
    out = _out_dir(options, setup.model)
    if _empty_shard(plan, options.shard):
        return Results(options, out, [], [])
    _check_device(options)
    store = ResultStore(out, shard=options.shard)  # --shard I/N: its own file, merged on read
    check_writable(out, store.path, shared=options.launcher != "none")  # before anything is loaded or measured

    say = _Progress(quiet=distributed.launcher_rank(options.launcher) != 0)
    allocator = keep_freed_memory()  # before the workspace: its evaluations and timings run with it
    resume = options.resume or options.is_sweep  # a sweep always resumes: re-running skips done runs
    with distributed.one_rank_at_a_time(options.launcher, out):  # single-process work (caches) before the process group starts
        ws = task.workspace(WorkspaceRequest(options=options, setup=setup, plan=plan, out=out, resume=resume,
                                             note=say.note))
    distributed.init_launcher(options.launcher, options.device)
    env = environment(options.device, command=None if command is None else list(command),
                      precision=options.precision, compiled=options.compile, cuda_graph=options.cuda_graph)
    env["allocator"] = allocator
    if options.device == "cpu":
        env["cpu_kernels"] = cpu_kernels.describe()
    isolation = Isolation(options, out, options.run_timeout) if options.isolated else None
    try:
        with waiting(options.wait and not os.environ.get("VITBENCH_NO_WAIT")):  # each timing on a quiet machine
            records = execute_plan(plan, ws, store, resume=resume, env=env, progress=say.step, isolation=isolation)
    except BaseException as exc:  # Ctrl-C or SIGTERM: the report of what finished, then stop as asked
        if not isinstance(exc, (Exception, SystemExit)) and distributed.is_main():
            _report_after_stop(options, store, out, env["command"])
        raise
    main = distributed.is_main()
    distributed.finish_launcher()  # every rank's part of the last collective evaluation is done
    if not main:
        return Results(options, out, records, [])  # rank 0 writes the report (and the records)
    stored = store.records()
    return _report(options, records, stored, out, env["command"], [c.describe() for c in store.corrupt_lines])


def _with_parsed_params(options: RunOptions, methods: list[str]) -> RunOptions:
    """``options`` with each method's parameters parsed, once, into its validated dataclass
    (:func:`~vitbench.host.values.method_values`); the task and the plan take them as they are."""
    import dataclasses

    return dataclasses.replace(options, params=method_values(methods, options.params,
                                                                  matched=options.matched_budgets is not None))


def _with_bounded_workers(options: RunOptions) -> RunOptions:
    """``--workers`` at most the usable cores (one line when lowered), before anything starts."""
    import dataclasses

    def note(text: str) -> None:
        print(f"vitbench: note: {text}", file=sys.stderr)

    workers = bounded_workers(options.workers, note)
    return options if workers == options.workers else dataclasses.replace(options, workers=workers)


def _empty_shard(plan: list, shard: Optional[tuple[int, int]]) -> bool:  # type: ignore[type-arg]
    """A job array with more parts than method runs leaves some parts empty: say so (nothing runs)."""
    if plan or shard is None:
        return False
    print(f"vitbench: shard {shard[0]}/{shard[1]} holds no runs of this plan (fewer method runs than "
          f"shards): nothing to do", file=sys.stderr)
    return True


def _check_device(options: RunOptions) -> None:
    if options.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise VitbenchError("--device cuda: no CUDA device is available here; valid devices: cpu")


def _out_dir(options: RunOptions, model_name: str) -> Path:
    prefix = "sweep-" if options.is_sweep else ""
    return Path(options.out or Path("runs") / f"{prefix}{options.task}-{model_name}")


def _report(options: RunOptions, records: list[Record], stored: list[Record], out: Path, command: str,
            skipped: Sequence[str] = ()) -> Results:
    """Write the report (a sweep's, or the comparison) from the store's records; ``skipped``: the
    store's lines that are no record, named on stderr and in the report."""
    for line in skipped:
        print(f"vitbench: warning: skipped {line}", file=sys.stderr)
    # the measuring stack: when a run starts; the command line starts light
    from vitbench.report import write_report, write_sweep_report

    try:
        if options.is_sweep:
            md, pngs = write_sweep_report(stored, out / "report.md", command=command, skipped=skipped)
            return Results(options, out, records, stored, md, tuple(pngs))
        md, png = write_report(stored, out / "report.md", command=command, skipped=skipped)
    except OSError as exc:
        raise OutputError(f"could not write the report in {str(out)!r} ({exc.strerror or type(exc).__name__}); "
                          f"the records are in the store: render them later with `vitbench report {out}`") from None
    # the measuring stack: when a run starts; the command line starts light
    from vitbench.report.batches import batch_plot_path, has_curves

    plots = (png,) if png is not None else ()
    return Results(options, out, records, stored, md, plots + ((batch_plot_path(md),) if has_curves(stored) else ()))


def _report_after_stop(options: RunOptions, store: Any, out: Path, command: str) -> None:
    """The report of the runs a stopped plan finished (none finished: nothing), best effort: a
    failure to write it is one line, never in the way of stopping."""
    stored = store.records()
    if not any(r.get("status") == "ok" for r in stored):
        return
    try:
        results = _report(options, [], stored, out, command)
    except (VitbenchError, OSError) as exc:
        print(f"vitbench: the report of the finished runs was not written: {exc}", file=sys.stderr)
        return
    print(f"vitbench: stopped; the report of the finished runs: {results.report}", file=sys.stderr)


class _Progress:
    """Progress lines on stderr: which run of how many, and what it is doing."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=quiet)  # quiet: ranks > 0

    def note(self, text: str) -> None:
        from rich.markup import escape

        self._print(f"[dim]vitbench:[/dim] {escape(text)}")

    def step(self, i: int, n: int, label: str, what: str) -> None:
        from rich.markup import escape

        self._print(f"[bold]\\[{i}/{n}][/bold] {escape(label)}: {escape(what)}")

    def _print(self, markup: str) -> None:
        """Through the command line's progress sink (above its bars) where one is installed."""
        if not progress.say(markup):
            self.console.print(markup)
