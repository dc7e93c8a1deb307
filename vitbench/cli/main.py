"""``vitbench``: the command line (docs/architecture.md, layer 1). One module per command group."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Optional

from vitbench import __version__
from vitbench.cli import default_model_cmd, list_cmd, plugins_cmd, report_cmd, run_cmd, sweep_cmd
from vitbench.cli import visualize_cmd
from vitbench.cli import reproduce_cmd
from vitbench.cli import describe_cmd
from vitbench.cli import cache_cmd
from vitbench.cli.signals import Terminated, signals_as_exceptions
from vitbench.errors import VitbenchError
from vitbench.data.workers import without_worker_traceback

COMMANDS = (run_cmd, sweep_cmd, list_cmd, describe_cmd, plugins_cmd, report_cmd, default_model_cmd,
            visualize_cmd, reproduce_cmd, cache_cmd)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other bad input (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"vitbench: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vitbench",
        description="Benchmark token merging, token pruning and channel selection for vision transformers.")
    parser.add_argument("--version", action="version", version=f"vitbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of the console script; bad input exits 2 with one line, no traceback (also
    while building the parser, which asks the plugins for their tasks' options)."""
    _undecodable_text_printable()
    try:
        with signals_as_exceptions():
            args = build_parser().parse_args(argv)
            return int(args.handler(args) or 0)
    except VitbenchError as exc:
        print(f"vitbench: error: {without_worker_traceback(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vitbench: interrupted; finished runs are in the store (use --resume)", file=sys.stderr)
        return 130
    except Terminated:
        print("vitbench: terminated (SIGTERM); finished runs are in the store (use --resume)", file=sys.stderr)
        return 143


def _undecodable_text_printable() -> None:
    """A path or argument holding bytes no encoding decodes prints as ``\\udcXX`` escapes
    instead of raising ``UnicodeEncodeError`` on a console that refuses them."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
