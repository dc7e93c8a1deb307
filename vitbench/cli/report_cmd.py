"""``vitbench report STORE -o FILE.md [--sweep]``: render a result store as markdown plus a PNG plot
(``--sweep``: a sweep's report with its Pareto PNGs, :mod:`vitbench.report.sweep`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitbench.errors import DataError
from vitbench.report import write_report
from vitbench.results import ResultStore


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render a result store (DIR or DIR/runs.jsonl) as markdown")
    p.add_argument("store", help="result store directory or runs.jsonl")
    p.add_argument("-o", "--output", required=True, help="markdown file to write (PNG beside it)")
    p.add_argument("--sweep", action="store_true",
                   help="render a `vitbench sweep` store as a sweep report (summary, Pareto PNGs, a table per budget)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.store)
    if not path.exists():
        raise DataError(f"result store {str(path)!r} does not exist")
    store = ResultStore(path)
    records = store.records()
    if not records:
        raise DataError(f"result store {str(store.path)!r} holds no records")
    if store.corrupt_lines:
        print(f"vitbench: note: skipped {len(store.corrupt_lines)} unreadable line(s) of {store.path}",
              file=sys.stderr)
    command = " ".join(["vitbench", *sys.argv[1:]])
    if args.sweep:
        from vitbench.report import write_sweep_report

        md, pngs = write_sweep_report(records, args.output, command=command)
        print(f"wrote {md} and {', '.join(map(str, pngs))}")
        return 0
    md, png = write_report(records, args.output, command=command)
    print(f"wrote {md} and {png}")
    return 0
