"""``vitbench reproduce``: the built-in methods' published rows (docs/reproduce.md).

``--list`` prints the rows; ``--check-gmacs [ROW ...]`` counts each row's GMACs on random weights
against its source's GFLOPs (exit 1 when one is off); ``ROW --data PATH [--checkpoint FILE |
--pretrained]`` runs the row as ``vitbench run`` does, writes the report with the published
numbers under it and checks top-1 and speed-up against them (exit 1 when one is off,
:mod:`vitbench.report.reproduced`). Heavy imports stay inside the handlers (``vitbench --help`` stays fast).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

from vitbench.errors import VitbenchError
from vitbench.reproduce.check import IMAGES, TOLERANCE, check_gmacs
from vitbench.reproduce import recipes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reproduce", help="re-run the built-in methods' published rows (--list, --check-gmacs, "
                                         "ROW --data PATH)")
    p.add_argument("rows", nargs="*", metavar="ROW", help="row id(s) from `vitbench reproduce --list`")
    p.add_argument("--list", action="store_true", help="print the rows: model, parameters, paper GFLOPs and "
                                                       "top-1, source (with ROWs: their data, reason and note too)")
    p.add_argument("--check-gmacs", action="store_true",
                   help="count the rows' GMACs (all, or the ROWs given) on random weights and compare with the "
                        "papers' GFLOPs; exit 1 when a row is off by more than 2 %% without a stated reason")
    p.add_argument("--data", default=None, help="evaluation images of the row (ImageNet-1k val as class folders)")
    p.add_argument("--checkpoint", default=None, help="local weights file of the row's model")
    p.add_argument("--pretrained", action="store_true", help="load timm's pretrained weights (needs the hub)")
    p.add_argument("--out", default=None, help="result directory (default: runs/reproduce-ROW)")
    p.add_argument("--metrics", default=None, help="comma-separated metrics (default: accuracy,gmacs, and "
                                                   "throughput where the row gives a speed-up)")
    p.add_argument("--limit", default=None, help="evaluate only the first N images")
    p.add_argument("--train-limit", default=None, help="learnable methods: fine-tune on the first N images")
    p.add_argument("--batch-size", default=32, help="throughput batch size (default 32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch ``--list``, ``--check-gmacs`` or one row's run; bad input is one line, exit 2."""
    rows = [recipes.recipe(row) for row in args.rows]  # an unknown id -> one line listing the valid ones
    if args.list and args.check_gmacs:
        raise VitbenchError("--list and --check-gmacs were both given; give one")
    if args.list:
        _print_list(rows or list(recipes.RECIPES))
        for r in rows:  # rows named: their details too
            print(f"\n{r.id}: data: {r.data}" + (f"\n  GMACs: {r.gmacs_reason}" if r.gmacs_reason else "")
                  + (f"\n  note: {r.note}" if r.note else ""))
        return 0
    if args.check_gmacs:
        return _check(rows or list(recipes.RECIPES))
    return _run_row(args, rows)


def _print_list(rows: list) -> None:  # type: ignore[type-arg]
    """A table: row id, method, model, params, paper GFLOPs, paper top-1, paper speed-up, source."""
    head = ("row", "method", "model", "params", "paper GFLOPs", "paper top-1 (%)", "paper speed-up", "source")
    table = [head] + [(r.id, r.method, r.model, r.params_text, _gflops(r), _num(r.paper_top1, ".2f"), _speedup(r),
                       r.source) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(head) - 1)]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1])


def _speedup(r) -> str:  # type: ignore[no-untyped-def]
    return "-" if r.paper_speedup is None else f"{r.paper_speedup:.2f}x ({r.paper_gpu})"


def _gflops(r) -> str:  # type: ignore[no-untyped-def]
    if r.paper_gflops is None and r.paper_fraction is not None:
        return f"{r.paper_fraction:g}x base"
    return _num(r.paper_gflops, "g")


def _num(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _check(rows: list) -> int:  # type: ignore[type-arg]
    """Count every row and print measured against paper; 1 when a row is off."""
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.host.environment import device_name

    print(f"GMACs on random weights (timm, pretrained=False), mean over {IMAGES} seeded random images of "
          f"each model's input size; {device_name('cpu')}; tolerance {TOLERANCE:.0%}")
    off = []
    for r in rows:
        started = time.perf_counter()
        c = check_gmacs(r)
        paper = _gflops(r) if c.reference is not None else "-"
        if c.measured is None:
            measured = "-"
        elif r.paper_gflops is None and r.paper_fraction is not None:
            measured = f"{c.measured:.3f}x base ({c.gmacs:.3f} / {c.baseline_gmacs:.3f})"
        else:
            measured = f"{c.measured:.3f}"
        diff = "" if c.difference is None else f"{c.difference:+.1%}"
        print(f"{r.id}: measured {measured}, paper {paper} {diff} -> {c.status} "
              f"({time.perf_counter() - started:.0f} s)".replace("  ", " "))
        if c.status in ("explained", "not counted"):
            print(f"    reason: {r.gmacs_reason}")
        if c.status == "off":
            off.append(r.id)
    if off:
        print(f"vitbench: error: GMACs off by more than {TOLERANCE:.0%} from the paper: {', '.join(off)}",
              file=sys.stderr)
        return 1
    print(f"{len(rows)} row(s): every counted row within {TOLERANCE:.0%} of its source or with its reason")
    return 0


def _run_row(args: argparse.Namespace, rows: list) -> int:  # type: ignore[type-arg]
    """Run one row through the normal run path; print the report's path and the published line."""
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.reproduced import check_row
    from vitbench.reproduce.run import default_metrics, published_fields, recipe_options, run_recipe

    if len(rows) != 1:
        given = " ".join(args.rows) or "none"
        raise VitbenchError(f"reproduce runs one row, got {given}; give one row id (`vitbench reproduce "
                            f"--list`), or --list / --check-gmacs")
    r = rows[0]
    if args.data is None:
        raise VitbenchError(f"reproduce {r.id} needs --data PATH: {r.data}")
    if args.checkpoint and args.pretrained:
        raise VitbenchError("--checkpoint and --pretrained were both given; give one")
    metrics = default_metrics(r) if args.metrics is None else tuple(m.strip() for m in args.metrics.split(","))
    options = recipe_options(r, args.data, checkpoint=args.checkpoint, pretrained=args.pretrained, out=args.out,
                             metrics=metrics, limit=args.limit, train_limit=args.train_limit,
                             batch_size=args.batch_size, device=args.device)
    results = run_recipe(r, options, command=_command(args, r.id))
    if results.report is None:
        return 0 if results.ok else 1  # a rank other than 0
    checks = check_row(published_fields(r), results.all_records)
    for c in checks:
        print(f"{c.what}: {c.status}, {c.detail}")
    print(f"report: {results.report} (the published numbers under the table)")
    off = [c.what for c in checks if c.status == "off"]
    if off:
        print(f"vitbench: error: {r.id} did not reproduce: {', '.join(off)} outside the tolerance", file=sys.stderr)
    return 0 if results.ok and not off else 1


def _command(args: argparse.Namespace, row: str) -> list[str]:
    """The command line as the report shows it."""
    words = ["vitbench", "reproduce", row]
    for flag in ("data", "checkpoint", "out", "metrics", "limit", "train_limit", "batch_size", "device"):
        value = getattr(args, flag)
        if value is not None and not (flag == "batch_size" and str(value) == "32") and \
                not (flag == "device" and value == "cpu"):
            words += [f"--{flag.replace('_', '-')}", str(value)]
    return words + (["--pretrained"] if args.pretrained else [])
