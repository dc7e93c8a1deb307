"""``vitbench run``: plan, execute, store and report (the one command that does the main job).

``vitbench run --task cls --methods M1,M2 [--model NAME] [--data PATH|fashion-mnist]
[--param METHOD.KEY=VALUE ...] [--metrics ...] [--batch-size B] [--device cpu|cuda] [--seed S | --seeds S1,S2,...]
[--out DIR] [--resume] [--match-gmacs F] [--launcher none|pytorch|slurm]``. The baseline always runs too.
Bad input exits 2 before anything runs. ``--match-gmacs F`` puts every method at F x the baseline's GMACs
(:mod:`vitbench.calibrate`); ``vitbench sweep`` (:mod:`vitbench.cli.sweep_cmd`) shares these
options and this code.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from vitbench.cli.task_options import add_task_options, check_task_options
from vitbench.distributed import add_launcher_option
from vitbench.errors import VitbenchError
from vitbench.plan import (
    CONTROL,
    DEFAULT_MODEL,
    DEFAULT_MODEL_TRAIN_LIMIT,
    METRICS,
    build_seeded_plan,
    check_seeds,
    parse_param_overrides,
    parse_seeds,
)
from vitbench.plugins import get_host


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run methods against the baseline and write runs.jsonl + report.md")
    add_run_options(p)
    p.add_argument("--match-gmacs", default=None, metavar="F",
                   help="matched compute: set every method's budget knob so that its GMACs land within "
                        "2 %% of F x the baseline's (0 < F <= 1); the chosen values go into the labels")
    p.set_defaults(handler=run)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options ``vitbench run`` and ``vitbench sweep`` share."""
    p.add_argument("--task", default="cls",
                   help=f"task: {', '.join(get_host().names('tasks'))} (see `vitbench list tasks`; a plugin can "
                        f"add more)")
    p.add_argument("--methods", required=True, help="comma-separated method names (see `vitbench list methods`)")
    p.add_argument("--model", default=None,
                   help=f"timm ViT/DeiT name; default: {DEFAULT_MODEL} (trained once on Fashion-MNIST)")
    p.add_argument("--data", default=None, help="ImageNet-style folder, or fashion-mnist (the default model's data)")
    p.add_argument("--param", action="append", default=[], metavar="METHOD.KEY=VALUE",
                   help="method parameter, e.g. tome.r=13 (repeatable)")
    p.add_argument("--metrics", default=None,
                   help=f"comma-separated subset of {','.join(METRICS)} (default: all; accuracy needs data)")
    p.add_argument("--batch-size", type=int, default=32, help="throughput batch size (default 32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=None, help="the one seed of every run (default 0)")
    p.add_argument("--seeds", default=None, metavar="S1,S2,...",
                   help="run every spec (the baseline too) once per seed, e.g. 0,1,2; the report shows "
                        "mean ± std over the seeds (instead of --seed)")
    p.add_argument("--out", default=None, help="result directory (default: runs/<task>-<model>)")
    p.add_argument("--resume", action="store_true", help="skip finished runs of the store, retry failed ones")
    p.add_argument("--pretrained", action="store_true", help="load timm's pretrained weights (needs the hub)")
    p.add_argument("--checkpoint", default=None, help="local weights file (.pth/.safetensors state dict)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="re-head the model for the data's N classes: the head of a --checkpoint with N "
                        "classes, else a new head fitted once on the data's train/ split (linear probe)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N images")
    p.add_argument("--train-backbone", action="store_true",
                   help="learnable methods: train the backbone too (default: only the method's parameters)")
    p.add_argument("--train-limit", type=int, default=None,
                   help="learnable methods: fine-tune on the first N training images (default: all; "
                        f"{DEFAULT_MODEL_TRAIN_LIMIT} with the default model)")
    p.add_argument("--precision", default="fp32", metavar="fp32|fp16|bf16",
                   help="autocast dtype of the measured forward, evaluation and (bf16) fine-tuning; GMACs "
                        "are counted the same (default fp32; bf16 works on the CPU too)")
    p.add_argument("--compile", action="store_true",
                   help="time the torch.compile'd model (throughput, latency, memory; GMACs and accuracy "
                        "on the eager one); a model that does not compile is timed eagerly, with the reason recorded")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time throughput and latency on a CUDA graph of the forward (one launch per forward); "
                        "a method whose shapes depend on the data, or a CPU run, is timed without one, with "
                        "the reason recorded")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run the I-th of N disjoint parts of the plan (a job array; I from 1), appending to "
                        "OUT/runs-shard-I-of-N.jsonl; the report (and `vitbench report OUT`) merges every part")
    add_launcher_option(p)
    add_task_options(p)  # each task's own, in a group per task (det/seg: --detector-epochs ...)


def _seeds(args: argparse.Namespace) -> tuple[int, ...]:
    """``--seeds 0,1,2`` or ``--seed S`` (default 0) as the plan's seeds; both at once is an error."""
    if args.seeds is not None and args.seed is not None:
        raise VitbenchError(f"--seed {args.seed} and --seeds {args.seeds} were both given; use --seed S "
                            f"for one seed or --seeds S1,S2,... for several")
    if args.seeds is not None:
        return parse_seeds(args.seeds)
    return check_seeds([0 if args.seed is None else args.seed])


def _budgets(args: argparse.Namespace) -> Optional[tuple[float, ...]]:
    """The matched budgets: ``vitbench sweep --budgets``, or ``(F,)`` for ``--match-gmacs F``,
    or ``None`` (every method at its own defaults)."""
    from vitbench.calibrate import check_fraction, parse_budgets

    if getattr(args, "budgets", None) is not None:
        return parse_budgets(args.budgets)
    if getattr(args, "match_gmacs", None) is not None:
        return (check_fraction(args.match_gmacs),)
    return None


def _with_gmacs(metrics: tuple[str, ...], budgets: Optional[tuple[float, ...]]) -> tuple[str, ...]:
    """Matched compute is checked on the GMACs count: it is measured whenever budgets are given."""
    if budgets is None or "gmacs" in metrics:
        return metrics
    print("vitbench: note: matched compute: measuring gmacs too (where each method landed)", file=sys.stderr)
    return ("gmacs", *metrics)


def _plan(budgets: Optional[tuple[float, ...]], shard: Optional[tuple[int, int]] = None,
          **kwargs) -> list:  # type: ignore[no-untyped-def,type-arg]
    """The run (or sweep) plan, or its ``--shard I/N`` part."""
    from vitbench.plan import build_sweep_plan, shard_plan

    plan = build_seeded_plan(**kwargs) if budgets is None else build_sweep_plan(budgets=budgets, **kwargs)
    return plan if shard is None else shard_plan(plan, *shard)


def _shard(args: argparse.Namespace) -> Optional[tuple[int, int]]:
    from vitbench.plan import parse_shard

    return parse_shard(args.shard) if args.shard is not None else None


def _empty_shard(plan: list, shard: Optional[tuple[int, int]]) -> bool:  # type: ignore[type-arg]
    """A job array with more parts than method runs leaves some parts empty: say so (exit 0)."""
    if plan or shard is None:
        return False
    print(f"vitbench: shard {shard[0]}/{shard[1]} holds no runs of this plan (fewer method runs than "
          f"shards): nothing to do", file=sys.stderr)
    return True


def _is_sweep(args: argparse.Namespace) -> bool:
    return getattr(args, "budgets", None) is not None


def _report(args: argparse.Namespace, records: list, store, out: Path, command: str) -> int:  # type: ignore[no-untyped-def,type-arg]
    """Write the report (a sweep's, or the comparison), print the summary, return the exit code."""
    if _is_sweep(args):
        from vitbench.report import write_sweep_report

        md, pngs = write_sweep_report(store.records(), out / "report.md", command=command)
        _print_sweep_summary(store.records(), md, pngs)
    else:
        from vitbench.report import write_report

        md, png = write_report(store.records(), out / "report.md", command=command)
        _print_summary(records, md, png)
    return 0 if all(r["status"] in ("ok", "skipped") for r in records) else 1


def _out_dir(args: argparse.Namespace, model_name: str) -> Path:
    prefix = "sweep-" if _is_sweep(args) else ""
    return Path(args.out or Path("runs") / f"{prefix}{args.task}-{model_name}")


def _methods(args: argparse.Namespace) -> list[str]:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise VitbenchError("--methods is empty; see `vitbench list methods`")
    return methods


def run(args: argparse.Namespace) -> int:
    """``vitbench run`` (and ``vitbench sweep``) for the task ``--task`` names: the task resolves its
    model and data and builds the workspace; the plan, the executor, the store and the report
    are the same for every task."""
    from vitbench.catalog import WorkspaceRequest
    from vitbench.distributed import (check_launcher, finish_launcher, init_launcher, is_main, launcher_rank,
                                      one_rank_at_a_time)
    from vitbench.environment import environment
    from vitbench.execute import execute_plan
    from vitbench.results import ResultStore

    task = get_host().task(args.task)  # unknown -> error listing the registered tasks
    check_task_options(args, task.name)  # another task's option (--detector-epochs with cls) is refused
    methods = _methods(args)
    launcher = getattr(args, "launcher", "none")
    check_launcher(launcher, task.name, methods)
    budgets = _budgets(args)
    setup = task.setup(args, methods)
    metrics = _with_gmacs(setup.metrics, budgets)
    shard = _shard(args)
    plan = _plan(budgets, shard, task=task.name, model=setup.model, methods=methods, data=setup.data,
                 overrides=parse_param_overrides(args.param), metrics=metrics,
                 batch_size=args.batch_size, device=args.device, seeds=_seeds(args),
                 checkpoint=args.checkpoint, pretrained=args.pretrained, precision=args.precision,
                 compile=args.compile, cuda_graph=args.cuda_graph, **setup.plan)
    if _empty_shard(plan, shard):
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise VitbenchError("--device cuda: no CUDA device is available here; valid devices: cpu")
    if args.limit is not None and args.limit < 1:
        raise VitbenchError(f"--limit {args.limit} is out of range; it must be >= 1")

    say = _Progress(quiet=launcher_rank(launcher) != 0)
    out = _out_dir(args, setup.model)
    resume = args.resume or _is_sweep(args)  # a sweep always resumes: re-running skips done runs
    with one_rank_at_a_time(launcher, out):  # single-process work (caches) before the process group starts
        ws = task.workspace(WorkspaceRequest(args=args, setup=setup, plan=plan, out=out, resume=resume,
                                             note=say.note))
    init_launcher(launcher, args.device)
    out.mkdir(parents=True, exist_ok=True)
    store = ResultStore(out, shard=shard)  # --shard I/N: its own file, merged on read
    env = environment(args.device, precision=args.precision, compiled=args.compile, cuda_graph=args.cuda_graph)
    records = execute_plan(plan, ws, store, resume=resume, env=env, progress=say.step)
    main = is_main()
    finish_launcher()  # every rank's part of the last collective evaluation is done
    if not main:
        return 0  # rank 0 writes the report (and the records)
    return _report(args, records, store, out, env["command"])


class _Progress:
    """Progress lines on stderr: which run of how many, and what it is doing."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=quiet)  # quiet: ranks > 0

    def note(self, text: str) -> None:
        self.console.print(f"[dim]vitbench:[/dim] {text}")

    def step(self, i: int, n: int, label: str, what: str) -> None:
        self.console.print(f"[bold][{i}/{n}][/bold] {label}: {what}")


def _print_summary(records: list, md: Path, png: Path) -> None:  # type: ignore[type-arg]
    from vitbench.report.tables import comparison_table

    first = records[0]
    table = comparison_table(records, first["task"], first["model"])
    print(table.to_markdown(index=False))
    print(f"\nreport: {md}\nplot:   {png}")


def _print_sweep_summary(records: list, md: Path, pngs: list) -> None:  # type: ignore[type-arg]
    from vitbench.report.sweep import summary_table
    from vitbench.report.tables import groups

    for task, model in groups(records):
        print(f"{task} · {model}")
        print(summary_table(records, task, model).to_markdown(index=False, disable_numparse=True))
    print(f"\nreport: {md}")
    for png in pngs:
        print(f"plot:   {png}")
