"""``vitbench report STORE [-o FILE] [--format md|csv|latex] [--sweep]``: render a result store as
markdown plus its plots (a sweep's report, :mod:`vitbench.report.sweep`, when the store holds a
sweep), or its tables as CSV or LaTeX (:mod:`vitbench.report.export`); ``-o`` defaults into STORE."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitbench.errors import DataError
from vitbench.core.files import special_file
from vitbench.results import ResultStore

FORMATS = ("md", "csv", "latex")
SUFFIXES = {"md": ".md", "csv": ".csv", "latex": ".tex"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render a result store (DIR or DIR/runs.jsonl) as markdown, CSV or LaTeX")
    p.add_argument("store", help="result store directory or runs.jsonl")
    p.add_argument("-o", "--output", default=None,
                   help="file to write (default: report.md, report.csv or report.tex in the store's folder; "
                        "a markdown report's plots go beside it)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="md (default; or what -o's suffix says), csv or latex: the report's tables")
    p.add_argument("--sweep", action="store_true",
                   help="render it as a sweep report (found by itself when the store holds a sweep)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.store)
    if not args.store.strip():
        raise DataError("the result store '' is empty; give a result directory or its runs.jsonl")
    if not path.exists():
        raise DataError(f"result store {str(path)!r} does not exist")
    store = ResultStore(path)
    records = store.records()
    if not records:
        raise DataError(f"result store {str(store.path)!r} holds no records{_why_empty(store)}")
    skipped = [line.describe() for line in store.corrupt_lines]  # named here and in the report
    for line in skipped:
        print(f"vitbench: warning: skipped {line}", file=sys.stderr)
    fmt = args.format or _format_of(args.output)
    folder = store.path.parent
    output = _output(args.output if args.output is not None else str(folder / f"report{SUFFIXES[fmt]}"))
    _not_the_store(output, store, args.output)
    command = " ".join(["vitbench", *sys.argv[1:]])
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.export import is_sweep, write_table

    sweep = is_sweep(records)
    if args.sweep and not sweep:
        raise DataError(f"--sweep: result store {str(store.path)!r} holds no sweep (no run was matched to a "
                        f"budget by `vitbench sweep`); render it without --sweep")
    try:
        if fmt != "md":
            print(f"wrote {write_table(records, output, fmt, sweep)}")
            return 0
        if sweep:
            # torch/pandas: when this command runs; `vitbench --help` stays light
            from vitbench.report import write_sweep_report

            md, pngs = write_sweep_report(records, output, command=command, skipped=skipped)
            print(f"wrote {md} and {', '.join(map(str, pngs))}")
            return 0
        # torch/pandas: when this command runs; `vitbench --help` stays light
        from vitbench.report import write_report

        md, png = write_report(records, output, command=command, skipped=skipped, folder=folder)
    except OSError as exc:
        raise DataError(f"cannot write the report {str(output)!r}: {exc.strerror or exc}") from None
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.batches import batch_plot_path, has_curves

    pngs = ([png] if png is not None else []) + ([batch_plot_path(md)] if has_curves(records) else [])
    print(f"wrote {md} and {', '.join(map(str, pngs))}" if pngs else f"wrote {md} (no plot: nothing to draw)")
    return 0


def _format_of(output: str | None) -> str:
    """The format ``-o``'s suffix names (``.csv``, ``.tex``), else ``md``."""
    suffix = Path(output).suffix.lower() if output else ""
    return {".csv": "csv", ".tex": "latex"}.get(suffix, "md")


def _why_empty(store: ResultStore) -> str:
    """Why a store holds no records: no store file, or only lines that are no run records."""
    if store.corrupt_lines:
        first = store.corrupt_lines[0]
        text = first.text if len(first.text) <= 40 else first.text[:37] + "..."
        return (f": its {len(store.corrupt_lines)} line(s) are no run records ({first.file} line {first.lineno}, "
                f"{first.reason}: {text!a})")
    if not any(f.is_file() for f in store.files()):
        return f": there is no {store.path.name} (is it a `vitbench run --out` folder?)"
    return f": {store.path.name} is empty"


def _not_the_store(output: Path, store: ResultStore, given: str | None) -> None:
    """Refuse to write the report over a file of the store's folder (``runs.jsonl``, a shard file),
    whether or not this command reads it."""
    target = output.resolve()
    for file in ResultStore(store.path.parent).files():
        if file.resolve() == target:
            raise DataError(f"-o {given!r} is a file of the result store {str(store.path.parent)!r}; a report "
                            f"would replace its records. Give another file, e.g. -o {output.with_name('report.md')}")


def _output(text: str) -> Path:
    """``-o FILE.md`` checked: a file path whose folder exists or can be made (PNGs go beside it)."""
    output = Path(text)
    if not text.strip() or output.name in ("", ".", ".."):
        raise DataError(f"-o {text!r} is no file name; give the markdown file to write, e.g. -o report.md")
    if output.is_dir():
        raise DataError(f"-o {text!r} is a folder; give the markdown file to write, e.g. -o {output / 'report.md'}")
    kind = special_file(output)
    if kind is not None:
        raise DataError(f"-o {text!r} is {kind}, not a file; give the markdown file to write, e.g. -o report.md")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"-o {text!r}: its folder cannot be made: {exc.strerror or exc}") from None
    if not output.parent.is_dir():
        raise DataError(f"-o {text!r}: {str(output.parent)!r} is not a folder")
    return output
