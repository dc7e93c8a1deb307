"""A sentence under a table for each method row that is slower than its baseline: fewer MACs that did
not become less time is the first thing a reader of a speed-up column must not miss
(docs/measuring.md, "Report shape")."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vitbench.report.tables import metric
from vitbench.task import BASELINE, CONTROL

__all__ = ["slower_lines"]


def _slower(rec: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """What of ``rec``'s timing is worse than ``base``'s, in words (empty: nothing)."""
    said = []
    bs = metric(rec, "batch_size")
    at = f" at batch {int(bs)}" if bs else ""
    tp, b_tp = metric(rec, "throughput_img_s"), metric(base, "throughput_img_s")
    speedup = metric(rec, "speedup")
    if speedup is not None and all(r.get("speedup_paired") for r in rec.get("per_seed") or [rec]):
        if speedup < 1.0:  # timed in turn with the baseline (vitbench.measure.paired)
            said.append(f"{speedup:.2f}x the baseline's speed{at} (timed in turn with it)")
    elif tp is not None and b_tp and tp < b_tp:
        said.append(f"{tp / b_tp:.2f}x the baseline's throughput{at}")
    lat, b_lat = metric(rec, "latency_ms"), metric(base, "latency_ms")
    if lat is not None and b_lat and lat > b_lat:
        said.append(f"{lat / b_lat:.2f}x its latency at batch 1")
    return said


def slower_lines(labels: Sequence[str], rows: Sequence[Mapping[str, Any]],
                 base: Mapping[str, Any] | None) -> list[str]:
    """A bullet per method row whose paired speed-up is below 1 (else whose throughput is below
    the baseline's) or whose batch-1 latency is above the baseline's, under one heading; nothing when every row is at least as fast or no baseline ran."""
    if base is None:
        return []
    found = [(lab, said) for lab, r in zip(labels, rows)
             if r.get("method") not in (BASELINE, CONTROL) and (said := _slower(r, base))]
    if not found:
        return []
    return (["**Slower than the baseline** on this machine (its saved MACs did not become less time):"]
            + [f"- {lab}: {' and '.join(said)}." for lab, said in found] + [""])
