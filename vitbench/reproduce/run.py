"""Run one recipe as ``vitbench run`` would (``vitbench reproduce ROW --data PATH``).

The recipe becomes :class:`~vitbench.core.options.RunOptions` (its model, method, parameters and head)
and runs through :func:`vitbench.api.run`: the same plan, executor, store and report. The
row's published numbers go into the run's folder (``published.json``), and the report gets a
"Published" section, the source's top-1 and GFLOPs beside the measured ones, which ``vitbench
report DIR`` writes again (:mod:`vitbench.report.attached`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from vitbench.core.options import RunOptions
from vitbench.reproduce.recipes import Recipe
from vitbench.api import run
from vitbench.core.cache import atomic_write
from vitbench.report.attached import PUBLISHED, published_section as section, with_published

if TYPE_CHECKING:
    from vitbench.api import Results

__all__ = ["DEFAULT_METRICS", "default_metrics", "published_fields", "published_section", "recipe_options",
           "run_recipe", "write_published"]

#: what a reproduction compares with the source
DEFAULT_METRICS = ("accuracy", "gmacs")


def default_metrics(r: Recipe) -> tuple[str, ...]:
    """What a run of ``r`` measures without ``--metrics``: :data:`DEFAULT_METRICS`, and throughput
    where the source gives a speed-up to check."""
    return DEFAULT_METRICS + (("throughput",) if r.paper_speedup is not None else ())


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
    """Run ``r`` with ``options`` (:func:`recipe_options`), leave the row's published numbers in
    the run's folder (``published.json``) and add them to its report, as ``vitbench report``
    would (:mod:`vitbench.report.attached`)."""
    results = run(options, command=command)
    write_published(results.out, r)
    if results.report is not None:
        add_published(results.report, published_section(r, results.all_records))
    return results


def published_fields(r: Recipe) -> dict[str, Any]:
    """What ``published.json`` holds: the row, its setting and the source's numbers."""
    return {"id": r.id, "method": r.method, "model": r.model, "params": r.params_text, "source": r.source,
            "paper_top1": r.paper_top1, "paper_gflops": r.paper_gflops,
            "paper_baseline_top1": r.paper_baseline_top1, "paper_baseline_gflops": r.paper_baseline_gflops,
            "paper_fraction": r.paper_fraction, "paper_img_s": r.paper_img_s,
            "paper_baseline_img_s": r.paper_baseline_img_s, "paper_gpu": r.paper_gpu,
            "gmacs_reason": r.gmacs_reason, "note": r.note, "eval_images": r.eval_images,
            "top1_tolerance_pp": r.top1_tolerance_pp, "speedup_tolerance": r.speedup_tolerance}


def write_published(folder: Path, r: Recipe) -> Path:
    """Write ``folder/published.json`` (whole or not at all), for the report to find again."""
    path = Path(folder) / PUBLISHED
    text = json.dumps(published_fields(r), indent=1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8", errors="backslashreplace"))
    return path


def published_section(r: Recipe, records: Sequence[Mapping[str, Any]]) -> str:
    """The markdown section: the source's and the measured top-1 and GMACs, baseline and method
    (the newest ok records of ``records``)."""
    return section(published_fields(r), records)


def add_published(report: Path, section: str) -> None:
    """Append ``section`` to the report, replacing one an earlier reproduction left there."""
    body = with_published(report.read_text(encoding="utf-8"), section)
    atomic_write(report, lambda tmp: tmp.write_text(body, encoding="utf-8", errors="backslashreplace"))
