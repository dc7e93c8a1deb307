"""One report row per spec across seeds: runs that differ only by their seed (``--seeds 0,1,2``)
are aggregated into one row (docs/measuring.md, "Seeds and spread").

The task's accuracy columns (:attr:`vitbench.task.TaskInfo.accuracy`: top-1 and top-5, mAP and its
APs) and the IB metrics become the mean and sample standard deviation (``<key>_seed_std``); GMACs and parameters the mean (GMACs' own spread pooled); throughput and
latency the median of the per-seed medians; speed-up and efficiency the median of the per-seed
values, each against the baseline of the same seed. Each row keeps ``seeds``, ``n_seeds`` and
the per-seed records under ``per_seed`` (for :mod:`vitbench.report.doubts`)."""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from vitbench.report.measured_on import on_key
from vitbench.report.task_shape import accuracy_columns
from vitbench.report.values import metric

__all__ = ["IB_KEYS", "aggregate_over_seeds", "pair_with_baselines", "seed_key", "spread_keys", "training_of"]

Record = Mapping[str, Any]

#: shown as mean ± sample std over seeds, besides the task's accuracy columns
IB_KEYS = ("ib_loss", "ib_bound")
#: shown as the mean over seeds
_MEAN_KEYS = ("gmacs", "backbone_gmacs", "params_m", "backbone_params_m", "peak_mem_mb", "train_s")
#: per-input spreads pooled as the root mean square over seeds
_POOLED_KEYS = ("gmacs_std", "backbone_gmacs_std")
#: shown as the median over seeds of the per-seed values
_MEDIAN_KEYS = ("throughput_img_s", "throughput_spread_img_s", "eval_img_s", "latency_ms", "latency_spread_ms",
                "speedup", "efficiency", "overhead_pct", "overhead_spread_pct", "overhead_ms",
                "train_throughput_img_s", "train_throughput_spread_img_s")


def seed_key(rec: Record) -> tuple[Any, ...]:
    """What a run is apart from its seed: method, label (parameters and training setup shown),
    parameters, data, batch size, matched budget, timing repeats (``--quick``), what it was
    measured on (:func:`~vitbench.report.measured_on.on_key`) and how it trained (:func:`training_of`).
    Records with equal keys are one row."""
    params = json.dumps(rec.get("params") or {}, sort_keys=True, default=str)
    return (rec.get("method"), rec.get("label"), params, rec.get("data"), rec.get("batch_size"),
            rec.get("match_gmacs"), rec.get("timing_repeats"), on_key(rec), training_of(rec))


def training_of(rec: Record) -> tuple[Any, ...]:
    """How a run trained, apart from its seed: its training images and each stage's name, epochs
    and images (``--train-limit 10000`` and ``60000`` are two rows, not two seeds of one)."""
    stages = tuple((s.get("name"), s.get("epochs"), s.get("images")) for s in rec.get("train_stages") or [])
    return rec.get("train_images"), stages


def spread_keys(task: str) -> tuple[str, ...]:
    """The fields shown as mean ± std over seeds: the task's accuracy columns', then :data:`IB_KEYS`."""
    return (*(k for column in accuracy_columns(task) for k in column.keys), *IB_KEYS)


def pair_with_baselines(rows: list[Record]) -> list[dict[str, Any]]:
    """Copies of ``rows`` where a method record without ``speedup``/``efficiency`` gets them from
    the baseline record of its own seed measured on the same images, head and weights (records
    written by the executor have them already)."""
    base_by_seed: dict[Any, Record] = {}
    for r in rows:
        if r.get("method") == "baseline":
            base_by_seed.setdefault((r.get("seed"), on_key(r)), r)
    out = []
    for r in rows:
        r = dict(r)
        base = base_by_seed.get((r.get("seed"), on_key(r)))
        tp, b_tp = metric(r, "throughput_img_s"), metric(base or {}, "throughput_img_s")
        if metric(r, "speedup") is None and tp is not None and b_tp:
            r["speedup"] = tp / b_tp
        gm, b_gm = metric(r, "gmacs"), metric(base or {}, "gmacs")
        if metric(r, "efficiency") is None and metric(r, "speedup") is not None and gm and b_gm:
            r["efficiency"] = r["speedup"] / (b_gm / gm)
        out.append(r)
    return out


def aggregate_over_seeds(rows: Iterable[Record]) -> list[dict[str, Any]]:
    """One row per :func:`seed_key`, in the order each key first appears (see the module
    docstring for what each metric becomes). A key with one record keeps its values as they
    are (no ``_seed_std``)."""
    paired = pair_with_baselines(list(rows))
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in paired:
        by_key.setdefault(seed_key(r), []).append(r)
    return [_aggregate(recs) for recs in by_key.values()]


def _aggregate(recs: list[dict[str, Any]]) -> dict[str, Any]:
    row = dict(recs[0])
    row["seeds"] = [r.get("seed") for r in recs]
    row["n_seeds"] = len(recs)
    row["per_seed"] = recs
    if len(recs) == 1:
        return row
    spread = spread_keys(str(row.get("task")))
    for key in spread + _MEAN_KEYS + _POOLED_KEYS + _MEDIAN_KEYS:
        values = [v for r in recs if (v := metric(r, key)) is not None]
        if not values:
            row.pop(key, None)
            continue
        if key in _MEDIAN_KEYS:
            row[key] = statistics.median(values)
        elif key in _POOLED_KEYS:
            row[key] = math.sqrt(sum(v * v for v in values) / len(values))
        else:
            row[key] = statistics.fmean(values)
        if key in spread:
            row[f"{key}_seed_std"] = statistics.stdev(values) if len(values) > 1 else None
            row[f"{key}_n"] = len(values)
    return row
