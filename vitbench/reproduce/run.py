"""Run one recipe as ``vitbench run`` would (``vitbench reproduce ROW --data PATH``).

The recipe becomes :class:`~vitbench.options.RunOptions` (its model, method, parameters and head)
and runs through :func:`vitbench.api.run`: the same plan, executor, store and report. The
report then gets a "Published" section: the source's top-1 and GFLOPs beside the measured ones.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from vitbench.options import RunOptions
from vitbench.reproduce.recipes import Recipe

if TYPE_CHECKING:
    from vitbench.api import Results

__all__ = ["DEFAULT_METRICS", "published_section", "recipe_options", "run_recipe"]

#: what a reproduction compares with the source
DEFAULT_METRICS = ("accuracy", "gmacs")
#: the heading of the section added under the report
HEADING = "## Published"


def recipe_options(r: Recipe, data: str, *, checkpoint: Optional[str] = None, pretrained: bool = False,
                   out: Optional[str] = None, metrics: Sequence[str] = DEFAULT_METRICS,
                   **options: Any) -> RunOptions:
    """The :class:`RunOptions` of ``vitbench run`` that run recipe ``r`` on ``data``; ``options``
    are further RunOptions fields (``limit``, ``device``, ``batch_size``, ``train_limit``)."""
    return RunOptions(task="cls", model=r.model, methods=(r.method,), data=data,
                      params={r.method: dict(r.params)}, metrics=tuple(metrics), checkpoint=checkpoint,
                      pretrained=pretrained, num_classes=r.num_classes,
                      out=out or str(Path("runs") / f"reproduce-{r.id}"), **options)


def run_recipe(r: Recipe, options: RunOptions, command: Optional[Sequence[str]] = None) -> "Results":
    """Run ``r`` with ``options`` (:func:`recipe_options`) and add the published numbers to its report."""
    from vitbench.api import run

    results = run(options, command=command)
    if results.report is not None:
        add_published(results.report, published_section(r, results.records))
    return results


def _measured(records: Sequence[Mapping[str, Any]], baseline: bool) -> Mapping[str, Any]:
    """This call's ok record of the baseline or of the method (the first seed's)."""
    for record in records:
        if record.get("status") == "ok" and (record.get("method") == "baseline") == baseline:
            return record
    return {}


def _cell(value: Any, fmt: str) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, fmt)
    return "not cited" if value is None else "n/a"


def _row(name: str, record: Mapping[str, Any], top1: Optional[float], gflops: Optional[float]) -> str:
    """One table row: the source's numbers beside the record's (``failed`` without an ok record)."""
    measured = [(_cell(record.get(key), fmt) if record else "failed") for key, fmt in (("top1_pct", ".2f"),
                                                                                      ("gmacs", ".3f"))]
    return f"| {name} | {_cell(top1, '.2f')} | {measured[0]} | {_cell(gflops, 'g')} | {measured[1]} |"


def published_section(r: Recipe, records: Sequence[Mapping[str, Any]]) -> str:
    """The markdown section: the source's and the measured top-1 and GMACs, baseline and method."""
    base, method = _measured(records, True), _measured(records, False)
    lines = [
        HEADING, "",
        f"Row `{r.id}` (`vitbench reproduce --list`): {r.method} on {r.model}, {r.params_text}.",
        f"Source: {r.source}.", "",
        "| | Paper top-1 (%) | Measured top-1 (%) | Paper GFLOPs | Measured GMACs |",
        "| --- | --- | --- | --- | --- |",
        _row("baseline", base, r.paper_baseline_top1, r.paper_baseline_gflops),
        _row(r.method, method, r.paper_top1, r.paper_gflops),
        "",
    ]
    if r.paper_fraction is not None:
        lines += [f"The source gives the method's compute as {r.paper_fraction:g}x its baseline's.", ""]
    if r.gmacs_reason:
        lines += [f"GMACs: {r.gmacs_reason}.", ""]
    if r.note:
        lines += [f"Note: {r.note}", ""]
    return "\n".join(lines)


def add_published(report: Path, section: str) -> None:
    """Append ``section`` to the report, replacing one an earlier reproduction left there."""
    from vitbench.cache import atomic_write

    text = report.read_text(encoding="utf-8")
    head, _, _ = text.partition("\n" + HEADING + "\n")
    body = head.rstrip("\n") + "\n\n" + section

    def write(tmp: Path) -> None:
        tmp.write_text(body, encoding="utf-8")

    atomic_write(report, write)
