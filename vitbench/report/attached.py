"""What other commands attach to a report, found as files in the run's folder, so that
``vitbench report DIR`` writes it again: ``visualize-*.png`` (``run --visualize``), linked under
"## Plot", and ``published.json`` (``vitbench reproduce``), the source's numbers rendered as the
"## Published" section beside the measured ones of the records (docs/reproduce.md, visualize.md).
"""
from __future__ import annotations

import json
import math
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from vitbench.errors import DataError
from vitbench.report.reproduced import check_lines, check_row, last_ok

__all__ = ["FIGURES", "HEADING", "PUBLISHED", "attach", "figure_line", "published_section", "with_figure",
           "with_published"]

#: the figures ``run --visualize`` writes into the run's folder
FIGURES = "visualize-*.png"
#: the file ``vitbench reproduce`` writes into the run's folder: the row and the source's numbers
PUBLISHED = "published.json"
#: the heading of the published numbers' section
HEADING = "## Published"


def figure_line(link: str) -> str:
    """The image line of a visualize figure; ``link``: its path relative to the report."""
    return f"![Patches merged (colour) and pruned (grey) after each block]({urllib.parse.quote(link, errors='surrogateescape')})"


def with_figure(text: str, link: str) -> str:
    """``text`` with the figure's line at the end of its "## Plot" section (a new section at the
    end if none); unchanged when the line is there."""
    line = figure_line(link)
    lines = text.splitlines()
    if line in lines:
        return text
    if "## Plot" in lines:
        end = next((i for i in range(lines.index("## Plot") + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        while end > 0 and not lines[end - 1].strip():
            end -= 1
        lines[end:end] = ["", line]
    else:
        lines += ["", "## Plot", "", line]
    return "\n".join(lines) + "\n"


def _cell(value: Any, fmt: str) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, fmt)
    return "not cited" if value is None else "n/a"


def _row(name: str, record: Mapping[str, Any], top1: Optional[float], gflops: Optional[float]) -> str:
    """One table row: the source's numbers beside the record's (``failed`` without an ok record)."""
    measured = [(_cell(record.get(key), fmt) if record else "failed") for key, fmt in (("top1_pct", ".2f"),
                                                                                      ("gmacs", ".3f"))]
    return f"| {name} | {_cell(top1, '.2f')} | {measured[0]} | {_cell(gflops, 'g')} | {measured[1]} |"


def published_section(row: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """The markdown section of a reproduced row (``row``: :data:`PUBLISHED`'s fields): the
    source's and the measured top-1 and GMACs, baseline and method, and whether they match
    (:mod:`~vitbench.report.reproduced`)."""
    base, method = last_ok(records, True), last_ok(records, False)
    lines = [
        HEADING, "",
        f"Row `{row['id']}` (`vitbench reproduce --list`): {row['method']} on {row['model']}, {row['params']}.",
        f"Source: {row['source']}.", "",
        "| | Paper top-1 (%) | Measured top-1 (%) | Paper GFLOPs | Measured GMACs |",
        "| --- | --- | --- | --- | --- |",
        _row("baseline", base, row.get("paper_baseline_top1"), row.get("paper_baseline_gflops")),
        _row(row["method"], method, row.get("paper_top1"), row.get("paper_gflops")),
        "",
    ]
    lines += check_lines(check_row(row, records))
    if row.get("paper_fraction") is not None:
        lines += [f"The source gives the method's compute as {row['paper_fraction']:g}x its baseline's.", ""]
    if row.get("gmacs_reason"):
        lines += [f"GMACs: {row['gmacs_reason']}.", ""]
    if row.get("note"):
        lines += [f"Note: {row['note']}", ""]
    return "\n".join(lines)


def with_published(text: str, section: str) -> str:
    """``text`` with ``section`` at its end, replacing a published section already there."""
    head, _, _ = text.partition("\n" + HEADING + "\n")
    return head.rstrip("\n") + "\n\n" + section


def attach(text: str, folder: Path, records: Sequence[Mapping[str, Any]], md_folder: Optional[Path] = None) -> str:
    """``text`` (a rendered report) with what ``folder`` holds: its figures, then its published
    row; ``md_folder``: where the report is written (the links are relative to it)."""
    md_folder = folder if md_folder is None else md_folder
    for png in sorted(folder.glob(FIGURES)):
        text = with_figure(text, Path(os.path.relpath(png, md_folder)).as_posix())
    published = folder / PUBLISHED
    if published.is_file():
        try:
            row = json.loads(published.read_text(encoding="utf-8"))
            section = published_section(row, records)
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{str(published)!r} is no published row ({type(exc).__name__}: {exc}); "
                            f"write it again with `vitbench reproduce ROW`, or remove it") from None
        text = with_published(text, section)
    return text
