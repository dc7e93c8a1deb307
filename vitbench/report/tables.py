"""The comparison table of one (task, model): baseline first, then methods, deltas vs that baseline.

Cells are formatted strings (the table is for reading, the store keeps the numbers) and "n/a"
wherever a metric does not apply to the row or was not measured. Columns follow the report
shape of docs/measuring.md; the accuracy columns are the task's (:attr:`TaskInfo.accuracy
<vitbench.task.TaskInfo.accuracy>`: top-1 for cls, box and mask mAP for det/seg).
Columns that no row measured are left out (:func:`drop_unmeasured`).
Runs that differ only by seed are one row (:mod:`vitbench.report.seeds`: accuracy as mean ±
std with a Seeds column saying n); a timing not to be trusted, and a speed-up or efficiency
derived from one, is marked ``†`` (:mod:`vitbench.report.doubts`). A row is compared only with
a baseline measured on the same images, head and weights (:mod:`vitbench.report.measured_on`);
its images, accuracy interval and weights are :mod:`vitbench.report.row_facts`'.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from vitbench.measure.speed import QUICK_REPEATS
from vitbench.report.doubts import MARK, row_doubts
from vitbench.report.measured_on import describe, on_key
from vitbench.report.row_facts import images, interval_pct, row_label, shows_top5, weights_from
from vitbench.report.seeds import aggregate_over_seeds
from vitbench.report.task_shape import accuracy_columns, task_spec
from vitbench.report.values import metric
from vitbench.results.store import latest_records
from vitbench.task import CONTROL, report_words

__all__ = [
    "NA", "accuracy_key", "drop_unmeasured", "gmacs_spec", "metric", "comparison_table", "group_records", "groups",
    "measured_groups", "method_label", "ok_rows", "panels", "pick_baseline", "pick_control", "row_labels",
    "trained_cell", "trained_epochs",
]

NA = "n/a"
Record = Mapping[str, Any]


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    if v is None:
        return NA
    s = format(v, spec)
    # "-0.00" / "+0.00": a rounded zero has no sign
    return (s.lstrip("+-") if float(s) == 0 else s) + unit


def _spread(v: float | None, sd: float | None, spec: str) -> str:
    if v is None:
        return NA
    if sd is not None and sd > 0 and float(_fmt(sd, spec)) > 0:  # no "± 0.0000": a spread below the shown digits
        return f"{_fmt(v, spec)} ± {_fmt(sd, spec)}"
    return _fmt(v, spec)


def _accuracy_cell(rec: Record, key: str, spec: str) -> str:
    """An accuracy cell: mean ± std over seeds; one run's percentage of images with its 95 %
    interval (``85.50 [80.0, 89.6]``, :func:`~vitbench.report.row_facts.interval_pct`)."""
    v, sd = metric(rec, key), metric(rec, f"{key}_seed_std")
    if key == "top5_pct" and not shows_top5(rec):
        return NA
    ci = interval_pct(v, images(rec)) if key.endswith("_pct") and int(rec.get("n_seeds") or 1) == 1 else None
    if ci is None:
        return _spread(v, sd, spec)
    return f"{_fmt(v, spec)} [{ci[0]:.1f}, {ci[1]:.1f}]"


def _marked(cell: str, doubts: list[str]) -> str:
    """``cell`` with the doubt mark when there are doubts and a number to mark."""
    return f"{cell} {MARK}" if doubts and cell != NA else cell


def gmacs_spec(v: float | None) -> str:
    """Format spec for a GMACs cell: 3 decimals, more for small models so that three
    significant figures survive (0.0312, not 0.03)."""
    if v is None or v <= 0:
        return ".3f"
    return f".{max(3, 2 - math.floor(math.log10(v)))}f"


def _short(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return format(v, "g")
    if isinstance(v, (list, tuple)):
        return ",".join(_short(x) for x in v)
    return str(v)


def method_label(rec: Record) -> str:
    """``tome (r=13)``: the record's ``label`` (the budget knob and the parameters that differ from
    the defaults; :func:`~vitbench.report.row_facts.row_label`) when the executor wrote one, else
    the method name with all its parameters in record order."""
    label = row_label(rec)
    if label:
        return label
    params = rec.get("params") or {}
    method = str(rec.get("method", "?"))
    if not params:
        return method
    return f"{method} ({', '.join(f'{k}={_short(v)}' for k, v in params.items())})"


def groups(records: Iterable[Record]) -> list[tuple[str, str]]:
    """The (task, model) pairs in the order they first appear in the store."""
    seen: dict[tuple[str, str], None] = {}
    for r in records:
        seen.setdefault((str(r.get("task")), str(r.get("model"))), None)
    return list(seen)


def accuracy_key(task: str) -> str:
    """The record field plotted and compared as "accuracy" for a task (its headline column)."""
    return accuracy_columns(task)[0].key


def group_records(records: Iterable[Record], task: str, model: str) -> list[dict[str, Any]]:
    """The newest record of each spec of ``(task, model)``, any status, in store order."""
    return [
        r for r in latest_records(records)
        if str(r.get("task")) == task and str(r.get("model")) == model
    ]


def pick_baseline(rows: Iterable[Record]) -> Record | None:
    """The first successful ``baseline`` record among ``rows`` (the reference for deltas)."""
    ok = (r for r in rows if r.get("status") == "ok")
    return next((r for r in ok if r.get("method") == "baseline"), None)


def pick_control(rows: Iterable[Record], like: Record | None = None) -> Record | None:
    """det/seg: the first successful control record (the baseline detector fine-tuned like the
    learnable methods' detectors, no method) -- the reference of fine-tuned rows' "vs +ft" deltas.
    With ``like`` (a store may hold controls of several ``--finetune-epochs``): the first trained
    as many epochs as ``like`` (its stages' together), else the first with ``like``'s recorded
    fine-tuning (``dense_finetune``), else the first."""
    controls = [r for r in rows if r.get("status") == "ok" and r.get("method") == CONTROL]
    if like is None or not controls:
        return next(iter(controls), None)

    def distance(control: Record) -> tuple[bool, bool]:
        return (trained_epochs(control) != trained_epochs(like),
                control.get("dense_finetune") != like.get("dense_finetune"))

    return min(controls, key=distance)  # the first of the nearest: min keeps the store's order


def trained_epochs(rec: Record) -> int:
    """The epochs of every training stage ``rec`` recorded, together (0: none)."""
    return sum(int(s.get("epochs") or 0) for s in rec.get("train_stages") or [])


def measured_groups(records: Iterable[Record], task: str, model: str) -> list[str]:
    """The :func:`~vitbench.report.measured_on.on_key` of the successful runs of ``(task, model)``
    (what they were measured on: data and images, head, weights), in store order; one key but
    where runs were measured on different images, heads or weights."""
    return list(dict.fromkeys(on_key(r) for r in group_records(records, task, model) if r.get("status") == "ok"))


def panels(records: Iterable[Record]) -> list[tuple[str, str, str | None, str]]:
    """``(task, model, on, note)`` per (task, model) and, where its runs were measured on
    several images, heads or weights, per :func:`measured_groups` key (``on``; ``None`` for
    one): the plots' rows; ``note`` ends their titles (a new line saying what they were measured
    on, or ``""``)."""
    records = list(records)
    out: list[tuple[str, str, str | None, str]] = []
    for task, model in groups(records):
        keys = measured_groups(records, task, model)
        if len(keys) < 2:
            out.append((task, model, None, ""))
        else:
            out += [(task, model, key, f"\nmeasured on {describe(key)}") for key in keys]
    return out


def ok_rows(records: Iterable[Record], task: str, model: str, on: str | None = None
            ) -> tuple[list[Record], Record | None]:
    """The successful runs of ``(task, model)`` (``on``: only those measured on that
    :func:`measured_groups` key), one row per spec across seeds
    (:func:`~vitbench.report.seeds.aggregate_over_seeds`), the reference baseline first, and
    that baseline."""
    ok = aggregate_over_seeds(r for r in group_records(records, task, model)
                              if r.get("status") == "ok" and (on is None or on_key(r) == on))
    base = pick_baseline(ok)
    if base is not None:
        ok = [base] + [r for r in ok if r is not base]
    return ok, base


def row_labels(rows: list[Record]) -> list[str]:
    """:func:`method_label` of each row; where labels would repeat, what tells the rows apart:
    the training images where they differ (``--train-limit``), the timing repeats (``--quick``,
    ``--repeats N``) where they differ, else the seed."""
    labels = [method_label(r) for r in rows]
    dup = {lab for lab in labels if labels.count(lab) > 1}

    def differ(key: str) -> set[str]:
        return {lab for lab in dup if len({r.get(key) for r, x in zip(rows, labels) if x == lab}) > 1}

    images_differ, repeats_differ = differ("train_images"), differ("timing_repeats")

    def tag(lab: str, rec: Record) -> str:
        if lab in images_differ:
            n = rec.get("train_images")
            return f"{lab} [trained on {f'{n:,}' if isinstance(n, int) else 'no'} images]"
        if lab in repeats_differ:
            n = rec.get("timing_repeats")
            return f"{lab} [{'--quick' if n == QUICK_REPEATS else f'--repeats {n}' if n else 'default repeats'}]"
        return f"{lab} [seed={rec.get('seed')}]" if lab in dup else lab

    return [tag(lab, r) for lab, r in zip(labels, rows)]


def trained_cell(rec: Record) -> str:
    """What a row trained before it was measured, in a few words: ``none``, ``938 steps on
    60,000 images``, ``shipped weights, trained 1 epoch on 60,000 images``, ``checkpoint``."""
    kind = rec.get("trained")
    if not kind:
        return "none"
    if kind == "shipped":
        return f"shipped weights, {rec.get('shipped_trained') or 'trained'}"
    if kind == "checkpoint":
        return "checkpoint of an earlier run"
    steps = sum(int(s.get("iters") or 0) for s in rec.get("train_stages") or [])
    return f"{steps:,} steps on {int(rec.get('train_images') or 0):,} images" if steps else "statistics only"


def comparison_table(records: Iterable[Record], task: str, model: str, on: str | None = None) -> pd.DataFrame:
    """One row per successful run of ``(task, model)`` (newest record per ``spec_id``), the
    baseline first; deltas, GMACs reduction, speed-up and efficiency against that baseline.

    A row is compared only with the baseline measured on the same images, head and weights
    (:func:`measured_groups`): ``on`` selects one such group; without it every group follows
    the one before, its own baseline first, and a "Measured on" column names each row's group
    when there are several. Speed-up and efficiency come from the record when the executor
    computed them (against the baseline of the same session); otherwise from the throughputs
    and GMACs in this table.
    """
    records = list(records)
    keys = [on] if on is not None else measured_groups(records, task, model)
    parts = [(key, *ok_rows(records, task, model, on=key)) for key in keys]
    rows = [r for _, part, _ in parts for r in part]
    acc_cols = accuracy_columns(task)

    batches = {int(b) for r in rows if (b := metric(r, "batch_size")) is not None}
    one_bs = len(batches) == 1
    tp_col = f"Throughput (img/s, bs={next(iter(batches))})" if one_bs else "Throughput (img/s)"
    eval_batches = {int(b) for r in rows if (b := metric(r, "eval_batch_size")) is not None}
    e2e_col = f"End to end (img/s, bs={next(iter(eval_batches))})" if len(eval_batches) == 1 else "End to end (img/s)"

    spec = task_spec(task)
    several_seeds = any(int(r.get("n_seeds") or 1) > 1 for r in rows)
    several_groups = len(parts) > 1
    table: list[dict[str, str]] = []
    for key, part, base in parts:
        rows_of = [{**row, "Measured on": describe(key)} if several_groups else row
                   for row in _rows(part, base, task, spec, tp_col, one_bs, several_seeds, e2e_col)]
        table += rows_of

    # every column a task can have; those no row measured (all n/a) are dropped below
    columns = (["Method"] + (["Measured on"] if several_groups else []) + (["Seeds"] if several_seeds else [])
               + (["Trained"] if any(r.get("trained") for r in rows) else []) + ["Params", "Images"])
    control = any(pick_control(part) is not None for _, part, _ in parts)  # tasks with a control row (det/seg) only
    for col in acc_cols:
        columns += ([col.title] + [title for title, _ in col.before] + [col.delta]
                    + ([f"{col.delta} vs +ft"] if control else []) + [title for title, _ in col.after])
    columns += ["GMACs", "GMACs ↓ (%)", "Backbone GMACs"]
    columns += [tp_col, e2e_col, "Speed-up (×)", "Efficiency", "Overhead (% of fwd)", "Latency bs=1 (ms)",
                "Train step (img/s)", "Train speed-up (×)"]
    columns += ["IB loss", "IB bound"]
    if len({weights_from(r) for r in rows}) > 1:  # shared weights are one line under the table
        columns.append("Weights")
    return drop_unmeasured(pd.DataFrame(table, columns=columns))


def _rows(rows: list[Record], base: Record | None, task: str, spec: Any, tp_col: str, one_bs: bool,
          several_seeds: bool, e2e_col: str = "End to end (img/s)") -> list[dict[str, str]]:
    """The table rows of one :func:`measured_groups` group, against its own baseline ``base``."""
    acc_cols = accuracy_columns(task)
    control = pick_control(rows)
    b_gmacs, b_tp = metric(base, "gmacs"), metric(base, "throughput_img_s")
    table: list[dict[str, str]] = []
    for rec, label in zip(rows, row_labels(rows)):
        doubts = row_doubts(rec, base, control)
        n = images(rec)
        row = {"Method": label, "Trained": trained_cell(rec), "Params": _fmt(metric(rec, "params_m"), ".2f", "M"),
               "Images": NA if n is None else str(n), "Weights": weights_from(rec) or NA}
        if several_seeds:
            row["Seeds"] = seeds_cell(rec.get("seeds") or [rec.get("seed")])
        for col in acc_cols:
            for title, key in col.before + col.after:  # shown as they are (top-5; AP50, AP75)
                row[title] = _accuracy_cell(rec, key, col.fmt)
            v, b = metric(rec, col.key), metric(base, col.key)  # means over seeds; the delta of the means
            row[col.title] = _accuracy_cell(rec, col.key, col.fmt)
            row[col.delta] = _fmt(v - b, "+" + col.fmt) if v is not None and b is not None else NA
            compared = spec is not None and report_words(spec).compared_with_control(rec)  # trained as the control did
            c = metric(pick_control(rows, like=rec), col.key) if compared else None
            row[f"{col.delta} vs +ft"] = _fmt(v - c, "+" + col.fmt) if v is not None and c is not None else NA

        gm = metric(rec, "gmacs")
        row["GMACs"] = _spread(gm, metric(rec, "gmacs_std"), gmacs_spec(gm))
        ratio = b_gmacs / gm if gm and b_gmacs else None  # baseline GMACs / method GMACs
        cut = (1 - gm / b_gmacs) * 100 if gm is not None and b_gmacs else None
        row["GMACs ↓ (%)"] = _fmt(cut, ".1f")
        # det/seg: the detector's GMACs above; the backbone's alone here (docs/measuring.md)
        bb = metric(rec, "backbone_gmacs")
        row["Backbone GMACs"] = _spread(bb, metric(rec, "backbone_gmacs_std"), gmacs_spec(bb))

        tp = metric(rec, "throughput_img_s")
        cell = _spread(tp, metric(rec, "throughput_spread_img_s"), ".1f")
        bs = metric(rec, "batch_size")
        if not one_bs and tp is not None and bs is not None:
            cell += f" (bs={int(bs)})"
        row[tp_col] = _marked(cell, doubts.throughput)
        row[e2e_col] = _marked(_fmt(metric(rec, "eval_img_s"), ".1f"), doubts.end_to_end)  # loading + model

        speedup = metric(rec, "speedup")
        if speedup is None and tp is not None and b_tp:
            speedup = tp / b_tp
        row["Speed-up (×)"] = _marked(_fmt(speedup, ".2f"), doubts.derived)
        eff = metric(rec, "efficiency")
        if eff is None and speedup is not None and ratio:
            eff = speedup / ratio
        row["Efficiency"] = _marked(_fmt(eff, ".2f"), doubts.derived)

        overhead = _spread(metric(rec, "overhead_pct"), metric(rec, "overhead_spread_pct"), ".1f")
        row["Overhead (% of fwd)"] = _marked(overhead, doubts.overhead)  # its own time beyond its counts' limit
        row["Latency bs=1 (ms)"] = _marked(_fmt(metric(rec, "latency_ms"), ".2f"), doubts.latency)
        row.update(_train_step_cells(rec, base))
        row["IB loss"] = _spread(metric(rec, "ib_loss"), metric(rec, "ib_loss_seed_std"), ".4f")
        row["IB bound"] = _spread(metric(rec, "ib_bound"), metric(rec, "ib_bound_seed_std"), ".4f")
        table.append(row)
    return table


def _train_step_cells(rec: Record, base: Record | None) -> dict[str, str]:
    """The training step's throughput (forward and backward, ``--metrics train_throughput``) and
    its ratio to the baseline's, marked where either timing is doubted."""
    tp, b_tp = metric(rec, "train_throughput_img_s"), metric(base, "train_throughput_img_s")
    doubted = [why for r in (rec, base) if r and (why := r.get("train_throughput_flag_reason"))]
    cell = _spread(tp, metric(rec, "train_throughput_spread_img_s"), ".1f")
    return {"Train step (img/s)": _marked(cell, doubted[:1]),
            "Train speed-up (×)": _marked(_fmt(tp / b_tp if tp and b_tp else None, ".2f"), doubted)}


def drop_unmeasured(df: pd.DataFrame, keep: tuple[str, ...] = ("Method",)) -> pd.DataFrame:
    """``df`` without the columns that no row measured (every cell "n/a"), except ``keep``: a
    GMACs-only run shows its GMACs, not eight columns of n/a."""
    return df[[c for c in df.columns if c in keep or (df[c] != NA).any()]]


def seeds_cell(seeds: list) -> str:  # type: ignore[type-arg]
    """``0,1,2 (n=3)``; a seed run more than once (the same setting stored under two metric
    sets) is listed once and counted: ``0,1,2 (n=6, 2 runs of each)``."""
    unique = list(dict.fromkeys(seeds))
    if len(unique) == len(seeds):
        return f"{','.join(map(str, seeds))} (n={len(seeds)})"
    runs = {seeds.count(s) for s in unique}
    each = f"{runs.pop()} runs of each" if len(runs) == 1 else "some seeds run more than once"
    return f"{','.join(map(str, unique))} (n={len(seeds)}, {each})"
