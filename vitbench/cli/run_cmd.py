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
from pathlib import Path
from typing import Any

from vitbench.cli.task_options import OwnedOption, add_task_options, check_task_options
from vitbench.host.distributed import add_launcher_option
from vitbench.errors import VitbenchError
from vitbench.core.metrics import METRICS
from vitbench.core.options import RunOptions
from vitbench.run.plan import parse_batch_sizes, parse_param_overrides, parse_seeds
from vitbench.host import get_host
from vitbench.tasks.cls import DEFAULT_MODEL, EMBEDDED_TRAIN_LIMIT


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run methods against the baseline and write runs.jsonl + report.md")
    groups = add_run_options(p)
    groups["run"].add_argument("--match-gmacs", default=None, metavar="F",
                   help="matched compute: set every method's budget knob so that its GMACs land within "
                        "2 %% of F x the baseline's (0 < F <= 1); the chosen values go into the labels")
    groups["run"].add_argument("--visualize", action="store_true",
                   help="also draw which patches each method merged or pruned (docs/visualize.md) into OUT")
    p.set_defaults(handler=run)


def add_run_options(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The options ``vitbench run`` and ``vitbench sweep`` share, in ``--help``'s groups; returns the
    groups by key (run, data, measure, train, dist) for a command's own options."""
    groups = {key: parser.add_argument_group(title) for key, title in (
        ("run", "what to run"), ("data", "data and weights"), ("measure", "measurement"),
        ("train", "fine-tuning (learnable methods)"), ("dist", "distributed and sharded runs"))}
    p = groups["run"]
    p.add_argument("--task", default="cls",
                   help=f"task: {', '.join(get_host().names('tasks'))} (default cls; see `vitbench list tasks`; "
                        f"a plugin can add more)")
    p.add_argument("--methods", required=True, help="comma-separated method names (see `vitbench list methods`)")
    p.add_argument("--param", action="append", default=[], metavar="METHOD.KEY=VALUE",
                   help="method parameter, e.g. tome.r=13 (repeatable; `vitbench describe METHOD` lists them)")
    p.add_argument("--seed", default=None, help="the one seed of every run (default 0)")
    p.add_argument("--seeds", default=None, metavar="S1,S2,...",
                   help="run every spec (the baseline too) once per seed, e.g. 0,1,2; the report shows "
                        "mean ± std over the seeds (instead of --seed)")
    p.add_argument("--out", default=None, help="result directory (default: runs/<task>-<model>)")
    p.add_argument("--resume", action="store_true", help="skip finished runs of the store, retry failed ones")
    p.add_argument("--isolate", action="store_true",
                   help="run each spec in a process of its own: a crash, an exit or a hang in plugin code is "
                        "that run's error record (costs a process start per run; docs/reliability.md)")
    p.add_argument("--run-timeout", default=None, metavar="SECONDS",
                   help="with --isolate (implied): kill a run that takes longer and record it as an error")
    p = groups["data"]
    p.add_argument("--model", default=None,
                   help=f"timm ViT/DeiT name; default: {DEFAULT_MODEL} (trained once on Fashion-MNIST)")
    p.add_argument("--data", default=None, help="ImageNet-style folder, or fashion-mnist (the default model's data)")
    p.add_argument("--pretrained", action="store_true", help="load timm's pretrained weights (needs the hub)")
    p.add_argument("--checkpoint", default=None, help="local weights file (.pth/.safetensors state dict)")
    p.add_argument("--num-classes", default=None,
                   help="re-head the model for the data's N classes: the head of a --checkpoint with N "
                        "classes, else a new head fitted once on the data's train/ split (linear probe)")
    p.add_argument("--limit", default=None, help="evaluate only the first N images (default: all)")
    p.add_argument("--workers", default=None, metavar="N",
                   help="loader worker processes for images that are decoded (the folder's first decoding, "
                        "fine-tuning; default: half the usable cores, at most 8; 0: in the main process)")
    p = groups["measure"]
    p.add_argument("--metrics", default=None,
                   help=f"comma-separated subset of {','.join(METRICS)} (default: all; accuracy needs data)")
    p.add_argument("--batch-size", default=32, help="throughput batch size (default 32)")
    p.add_argument("--batch-sizes", default=None, metavar="B1,B2,...",
                   help="also time throughput and latency at each batch size, e.g. 1,4,16,64: the report "
                        "plots speed-up against batch size and names where each method starts to pay")
    p.add_argument("--device", default="cpu", metavar="cpu|cuda", help="where to run (default cpu)")
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
    p.add_argument("--quick", action="store_true",
                   help="a fast look: time throughput and latency with 3 repeats each (the report says so; "
                        "not for publication)")
    p.add_argument("--repeats", default=None, metavar="N",
                   help="repeats of each timing, throughput, latency and the paired speed-up "
                        "(1 to 10000; default 10, 20 and 30 rounds)")
    p = groups["train"]
    p.add_argument("--train-backbone", action="store_true",
                   help="learnable methods: train the backbone too (default: only the method's parameters)")
    p.add_argument("--train-limit", default=None,
                   help="learnable methods: fine-tune on the first N training images (default: all; "
                        f"{EMBEDDED_TRAIN_LIMIT[DEFAULT_MODEL]} with the default model)")
    p = groups["dist"]
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run the I-th of N disjoint parts of the plan (a job array; I from 1), appending to "
                        "OUT/runs-shard-I-of-N.jsonl; the report (and `vitbench report OUT`) merges every part")
    add_launcher_option(p)  # type: ignore[arg-type]  # a group takes add_argument like a parser
    add_task_options(parser)  # each task's own, in a group per task (det/seg: --detector-epochs ...)
    return groups


def run(args: argparse.Namespace) -> int:
    """``vitbench run`` (and ``vitbench sweep``): the options as :class:`~vitbench.core.options.RunOptions`,
    run by :func:`vitbench.api.run`; print the summary table and the report's paths."""
    from vitbench.api import run as run_benchmark

    from vitbench.core import progress
    from vitbench.host.distributed import launcher_rank

    task = get_host().task(args.task)  # unknown -> error listing the registered tasks
    check_task_options(args, task.name)  # another task's option (--detector-epochs with cls) is refused
    options = run_options(args, task.name)
    if getattr(args, "visualize", False):
        from vitbench.cli.visualize_cmd import check_run_visualize
        check_run_visualize(args, task.name)  # another task or a non-ViT model: refused before the run
    quiet = launcher_rank(options.launcher) != 0  # ranks > 0 stay silent; rank 0 reports for all
    with progress.reporting(progress.sink_for(quiet=quiet)):  # bars on a terminal, else plain lines
        results = run_benchmark(options)
    if results.report is None:
        return 0  # an empty shard, or a rank other than 0
    if results.options.is_sweep:
        _print_sweep_summary(results.records, results.report, list(results.plots))  # this plan's: its data, its budgets
    else:
        _print_summary(results.records, results.report, list(results.plots))
        if getattr(args, "visualize", False):
            from vitbench.cli.visualize_cmd import visualize_run
            visualize_run(results)
    return 0 if results.ok else 1


def run_options(args: argparse.Namespace, task: str) -> RunOptions:
    """The parsed command line as typed options (``--param`` strings as a mapping, lists as tuples,
    the options of ``task`` alone as its ``task_options``)."""
    from vitbench.measure.speed import chosen_repeats
    from vitbench.run.plan import parse_shard

    owned: dict[str, OwnedOption] = getattr(args, "task_options", {}) or {}
    budgets, match = getattr(args, "budgets", None), getattr(args, "match_gmacs", None)
    if args.metrics is not None and not _names(args.metrics):
        raise VitbenchError(f"--metrics {args.metrics!r} names no metric; valid metrics of --task {task}: "
                            f"{', '.join(get_host().task(task).metrics)} (or leave --metrics out for all)")
    return RunOptions(
        task=args.task, methods=_names(args.methods), model=args.model, data=args.data,
        params=parse_param_overrides(args.param), metrics=None if args.metrics is None else _names(args.metrics),
        batch_size=args.batch_size,
        batch_sizes=None if args.batch_sizes is None else parse_batch_sizes(args.batch_sizes), device=args.device,
        seed=args.seed, seeds=None if args.seeds is None else parse_seeds(args.seeds),
        out=args.out, resume=args.resume, pretrained=args.pretrained, checkpoint=args.checkpoint,
        num_classes=args.num_classes, limit=args.limit, workers=args.workers,
        train_backbone=args.train_backbone, train_limit=args.train_limit,
        precision=args.precision,
        compile=args.compile, cuda_graph=args.cuda_graph,
        quick=args.quick, repeats=None if args.repeats is None else chosen_repeats(args.quick, args.repeats),
        shard=None if args.shard is None else parse_shard(args.shard), launcher=getattr(args, "launcher", "none"),
        match_gmacs=match,
        budgets=budgets, controls=getattr(args, "controls", True),
        isolate=args.isolate, run_timeout=args.run_timeout,
        task_options={dest: getattr(args, dest) for dest, option in owned.items() if task in option.tasks})


def _names(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _print_summary(records: list, md: Path, pngs: list) -> None:  # type: ignore[type-arg]
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
    from vitbench.report.sweep import summary_table
    from vitbench.report.tables import groups

    for task, model in groups(records):
        print(f"{task} · {model}")
        print(summary_table(records, task, model).to_markdown(index=False, disable_numparse=True))
    print(f"\nreport: {md}")
    for png in pngs:
        print(f"plot:   {png}")
