"""Whether a reproduced row matched its source (``vitbench reproduce ROW --data PATH``): the
measured top-1 of the baseline and of the method within a stated tolerance of the source's, and
the speed-up -- the ratio of throughputs, never the images per second of another machine --
within a stated fraction of the source's (docs/reproduce.md, "Checking a row").

A top-1 is checked only on the whole evaluation set the source used (``--limit`` gives another
number); a check the run cannot make says why instead of passing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from vitbench.report.values import number

__all__ = ["EVAL_IMAGES", "SPEEDUP_TOLERANCE", "TOP1_TOLERANCE_PP", "RowCheck", "check_lines", "check_row", "last_ok"]

#: a top-1 within this many percentage points of the source's matches it (a row may state its own)
TOP1_TOLERANCE_PP = 0.5
#: a speed-up within this fraction of the source's matches it (a row may state its own)
SPEEDUP_TOLERANCE = 0.15
#: the evaluation images of a row that does not say (ImageNet-1k's validation set)
EVAL_IMAGES = 50_000


@dataclass(frozen=True)
class RowCheck:
    """One comparison with the source: what, the verdict (``ok``, ``off``, ``not checked``), in words."""

    what: str
    status: str
    detail: str

    def line(self) -> str:
        return f"- {self.what}: **{self.status}**, {self.detail}."


def last_ok(records: Sequence[Mapping[str, Any]], baseline: bool) -> Mapping[str, Any]:
    """The newest ok record of the baseline or of the method (the store's last); ``{}`` for none."""
    for record in reversed(records):
        if record.get("status") == "ok" and (record.get("method") == "baseline") == baseline:
            return record
    return {}


def _top1(what: str, record: Mapping[str, Any], paper: float, tolerance: float, images: int) -> RowCheck:
    if not record:
        return RowCheck(what, "not checked", "the run did not finish")
    top1 = number(record.get("top1_pct"))
    if top1 is None:
        return RowCheck(what, "not checked", "no top-1 was measured (add accuracy to --metrics)")
    evaluated = record.get("num_images")
    if evaluated != images:
        return RowCheck(what, "not checked", f"measured {top1:.2f} % on {evaluated} images, the source on "
                                             f"{images:,} (leave --limit out to check it)")
    diff = top1 - paper
    status = "ok" if abs(diff) <= tolerance else "off"
    return RowCheck(what, status, f"measured {top1:.2f} %, the source {paper:.2f} % ({diff:+.2f} points; "
                                  f"tolerance {tolerance:g})")


def _speedup(row: Mapping[str, Any], method: Mapping[str, Any], tolerance: float) -> Optional[RowCheck]:
    paper_tp, paper_base = number(row.get("paper_img_s")), number(row.get("paper_baseline_img_s"))
    if paper_tp is None or not paper_base:
        return None
    paper = paper_tp / paper_base
    what, gpu = "speed-up", row.get("paper_gpu") or "its GPU"
    if not method:
        return RowCheck(what, "not checked", "the run did not finish")
    measured = number(method.get("speedup"))
    if measured is None:
        return RowCheck(what, "not checked", f"no throughput was measured (add throughput to --metrics; the "
                                             f"source's is {paper:.2f}x on a {gpu})")
    off = measured / paper - 1
    device = (method.get("env") or {}).get("device") or "this machine"
    batch = method.get("batch_size")
    status = "ok" if abs(off) <= tolerance else "off"
    return RowCheck(what, status, f"measured {measured:.2f}x on {device}" + (f" at batch {batch}" if batch else "")
                    + f", the source {paper:.2f}x on a {gpu} ({off:+.1%}; tolerance {tolerance:.0%}; the ratio "
                      f"is compared, never the images per second)")


def check_row(row: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[RowCheck]:
    """The checks of a reproduced row (``row``: ``published.json``'s fields) against the newest ok
    baseline and method records: each top-1 the source gives, and its speed-up where it gives
    both throughputs."""
    base, method = last_ok(records, True), last_ok(records, False)
    tolerance = number(row.get("top1_tolerance_pp")) or TOP1_TOLERANCE_PP
    images = int(row.get("eval_images") or EVAL_IMAGES)
    out = []
    for what, record, key in (("baseline top-1", base, "paper_baseline_top1"),
                              (f"{row.get('method')} top-1", method, "paper_top1")):
        paper = number(row.get(key))
        if paper is not None:
            out.append(_top1(what, record, paper, tolerance, images))
    speedup = _speedup(row, method, number(row.get("speedup_tolerance")) or SPEEDUP_TOLERANCE)
    return out + ([speedup] if speedup is not None else [])


def check_lines(checks: Sequence[RowCheck]) -> list[str]:
    """The checks as the published section's lines (nothing when the source gives nothing to check)."""
    if not checks:
        return []
    return ["Checked against the source:"] + [c.line() for c in checks] + [""]
