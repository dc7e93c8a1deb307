"""Executes a run plan: each spec reduces a fresh copy of the model, measures it, and appends
one record to the store as it ends (docs/architecture.md, layers 5-7).

Each run reduces a copy of the workspace's model with its method (matched compute choosing the
budget knob first) and hands it to its task (:class:`~vitbench.task.Task`, asked of the plugin
host by the spec's task name), which fine-tunes and measures it; this module sequences the runs,
pairs each run with its seed's baseline and writes the records. A run that fails is recorded as ``error``
with its message and the other runs go on; records are appended whole, so an interrupted plan
never leaves a half-written result, and ``--resume`` skips finished specs and retries failed ones.
Under ``--launcher pytorch|slurm`` every rank runs every spec (evaluation and fine-tuning are
collective) and only rank 0 appends records (:mod:`vitbench.host.distributed`); after each run the
ranks exchange their outcomes, so that a run that failed on any rank is an ``error`` record
naming the rank(s), even where rank 0 itself succeeded.
"""
from __future__ import annotations

import copy
import random
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import numpy as np
import torch

from vitbench import measure
from vitbench.measure._common import check_positive_finite
from vitbench.measure.calibrate import Calibration, GmacsCounter, calibrate, not_matchable, off_pct
from vitbench.data.workers import without_worker_traceback
from vitbench.host.distributed import failure_on_any_rank, is_main
from vitbench.errors import BudgetError, VitbenchError, failure_text
from vitbench.core.interrupts import is_ctrl_c
from vitbench.run.isolate import Isolation, run_isolated
from vitbench.run.estimate import seconds_left
from vitbench.run.plan import BASELINE, REFERENCES, RunSpec
from vitbench.host import get_host
from vitbench.host.apply import apply
from vitbench.core.progress import steps
from vitbench.results import ResultStore
from vitbench.results.writable import rescue_record
from vitbench.task import CONTROL, Task, Workspace, compute_key

Progress = Callable[[str], None]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reduced_copy(ws: Workspace, method: Optional[str], values: Any) -> Any:
    """A copy of the workspace's model reduced by ``method`` with ``values`` (its parameter
    dataclass); ``method=None``: the unreduced copy."""
    model = copy.deepcopy(ws.model)
    return model if method is None else apply(model, method, values)


def gmacs_counter(spec: RunSpec, ws: Workspace, task: Task, progress: Progress) -> GmacsCounter:
    """``spec``'s seed's counter of a reduced copy's GMACs, as the task counts them (cached in the
    workspace); a task that counts none cannot match compute."""
    if spec.seed not in ws.counters:
        count = ws.gmacs_of(spec, progress)
        if count is None:
            raise BudgetError(f"task {task.name!r} cannot match compute: it counts no GMACs for a budget "
                              f"(run it without --match-gmacs/--budgets)")
        ws.counters[spec.seed] = GmacsCounter(lambda method, values: count(reduced_copy(ws, method, values)))
    return ws.counters[spec.seed]


def match_compute(spec: RunSpec, ws: Any, progress: Progress, task: Optional[Task] = None) -> Calibration:
    """Choose ``spec``'s budget knob so that its GMACs land at ``spec.match_gmacs`` x the
    baseline's, counted as the report counts them (the task's :attr:`~vitbench.task.TaskInfo.counts`: det/seg
    count the backbone, the part the methods reduce). Raises
    :class:`~vitbench.errors.BudgetError` when it cannot."""
    task = task or get_host().task(spec.task)
    method = get_host().method(spec.method)
    knob = method.budget
    if knob is None:  # before counting anything: a det/seg counter trains the detector first
        raise not_matchable(spec.method)
    counter = gmacs_counter(spec, ws, task, progress)
    how = "setting" if knob.mode == "fraction" else "searching"
    progress(f"{how} {spec.method}.{knob.param} for {spec.match_gmacs:g}x the baseline's GMACs")
    info = get_host().family_of(ws.model).describe(ws.model)
    result = calibrate(method, spec.values, spec.match_gmacs, counter, info)
    if result.calibrated_gmacs is not None:
        progress(f"{result.param}={result.value}: {result.calibrated_gmacs:.4g} GMACs, "
                 f"{off_pct(result.calibrated_gmacs, result.target_gmacs):+.2f} % from the target "
                 f"{result.target_gmacs:.4g} ({result.counts} settings evaluated)")
    return result


def _landed(task: Task, record: dict[str, Any]) -> None:
    """Where a matched run's measured GMACs landed against its target (after any fine-tuning)."""
    budget = record.get("budget")
    gmacs = record.get(compute_key(task))
    if not budget or gmacs is None:
        return
    off = off_pct(gmacs, budget["target_gmacs"])
    budget.update(counted=task.info.counts, landed_gmacs=gmacs,
                  landed_off_pct=off, landed_within=abs(off) <= budget["tolerance_pct"])


def _relative(spec: RunSpec, out: dict[str, Any], baseline: Optional[dict]) -> dict[str, Any]:
    """Speed-up and efficiency against the plan's baseline (docs/measuring.md): the task's paired
    speed-up where it timed one (``speedup_paired``), else the ratio of the two throughputs; and
    with ``--batch-sizes`` the speed-up at each batch size both timed."""
    if spec.method == BASELINE:
        if out.get("throughput_img_s"):
            out.update(speedup=1.0, efficiency=1.0 if out.get("gmacs") else None)
    else:
        if out.get("speedup_paired"):  # timed by the task in turn with the baseline
            check_positive_finite("speedup", out.get("speedup"))
        elif baseline and baseline.get("throughput_img_s") and out.get("throughput_img_s"):
            out["speedup"] = measure.speedup(out["throughput_img_s"], baseline["throughput_img_s"])
        if out.get("speedup") and baseline and baseline.get("gmacs") and out.get("gmacs"):
            out["efficiency"] = measure.efficiency(out["speedup"], baseline["gmacs"], out["gmacs"])
    if out.get("batch_curve"):
        base_curve = {p["batch_size"]: p for p in (baseline or {}).get("batch_curve") or ()}
        for point in out["batch_curve"]:
            base = base_curve.get(point["batch_size"]) if spec.method != BASELINE else point
            if base and base.get("throughput_img_s") and point.get("throughput_img_s"):
                point["speedup"] = measure.speedup(point["throughput_img_s"], base["throughput_img_s"])
    return out


def run_spec(spec: RunSpec, ws: Any, baseline: Optional[dict], env: dict[str, Any],
             progress: Progress) -> dict[str, Any]:
    """Run one spec and return its record (status ``ok`` or ``error``, never raising)."""
    started = time.perf_counter()
    record: dict[str, Any] = {
        "spec_id": spec.spec_id, "task": spec.task, "model": spec.model, "data": spec.data,
        "method": spec.method, "label": spec.label, "params": spec.params, "seed": spec.seed, "status": "ok",
        "error": None, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if spec.match_gmacs is not None:
        record["match_gmacs"] = spec.match_gmacs
    if spec.img_size is not None:
        record["img_size"] = spec.img_size
    record["precision"] = spec.precision_name
    try:
        task = get_host().task(spec.task)
        record.update(ws.record_fields())
        seed_everything(spec.seed)
        values = spec.values
        if spec.match_gmacs is not None and spec.method not in REFERENCES:
            matched = match_compute(spec, ws, progress, task)
            values = matched.values
            record.update(params=matched.params, label=spec.matched_label(matched.params), budget=matched.record())
            seed_everything(spec.seed)  # the search must not change what the run draws
        if spec.method not in REFERENCES:
            progress("applying the method")
        model = reduced_copy(ws, None if spec.method in REFERENCES else spec.method, values)
        record.update(_relative(spec, task.run(spec, ws, model, progress), baseline))
        _landed(task, record)
    except VitbenchError as exc:
        record.update(status="error", error=without_worker_traceback(str(exc)))
    except Exception as exc:  # noqa: BLE001 - one failed run must not take the others down
        record.update(status="error", error=f"{type(exc).__name__}: {without_worker_traceback(str(exc))}")
    except (SystemExit, KeyboardInterrupt) as exc:  # plugin code exiting fails its run only
        if is_ctrl_c(exc):
            raise
        record.update(status="error", error=failure_text(exc))
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["wall_s"] = round(time.perf_counter() - started, 3)
    record["env"] = env
    return record


def _append(store: ResultStore, record: dict[str, Any]) -> None:
    """Append ``record`` to the store; when that fails (a full disk), keep it in a rescue file
    and say where (:func:`~vitbench.results.writable.rescue_record`), so no measurement is lost."""
    try:
        store.append(record)
    except OSError as exc:
        record["rescued_to"] = str(rescue_record(record, store.path, exc))


def execute_plan(plan: list[RunSpec], ws: Any, store: ResultStore, *, resume: bool,
                 env: dict[str, Any], progress: Callable[[int, int, str, str], None],
                 isolation: Optional[Isolation] = None) -> list[dict]:
    """Run every spec of ``plan`` in order, appending each record to ``store`` as it ends (with
    ``isolation``, each in a process of its own: :mod:`vitbench.run.isolate`).

    Speed-up and efficiency pair each method run with the baseline of the same seed (a plan
    with ``--seeds`` holds one baseline per seed); on ``--resume`` a finished baseline of the
    store serves its seed."""
    host = get_host()
    latest = store.latest() if resume else {}
    finished = store.finished_ids() if resume else set()
    baselines: dict[int, dict] = {}  # seed -> that seed's successful baseline record
    for spec in plan:
        if spec.method == BASELINE and spec.spec_id in finished and latest[spec.spec_id]["status"] == "ok":
            baselines[spec.seed] = latest[spec.spec_id]
    records: list[dict] = []

    def trains(spec: RunSpec) -> bool:
        return spec.method == CONTROL or (spec.method != BASELINE and host.method(spec.method).trains(spec.values))

    with steps("runs of the plan", len(plan), "runs") as runs:  # the plan's bar (vitbench.core.progress)
        for i, spec in enumerate(plan, start=1):
            runs.note(spec.label)
            if spec.spec_id in finished:
                progress(i, len(plan), spec.label, "already finished (resume): skipped")
                records.append(latest[spec.spec_id])
                runs.expect(seconds_left(plan[i:], list(zip(plan, records)), trains))
                runs.advance()
                continue
            main = is_main()  # --launcher pytorch: rank 0 alone records (every rank runs every spec)
            if main:
                host.run_started(spec)
            if isolation is not None:
                record = run_isolated(spec, baselines.get(spec.seed), env, isolation, (i, len(plan)))
            else:
                record = run_spec(spec, ws, baselines.get(spec.seed), env,
                                  lambda what: progress(i, len(plan), spec.label, what))
            # a collective, like the barrier it replaces: the other ranks wait here while rank 0
            # measures (no load beside its timings), then every rank learns whether any failed
            failure = failure_on_any_rank(record["error"] if record["status"] == "error" else None)
            if failure is not None and failure != record["error"]:
                record.update(status="error", error=failure)
            if main:
                _append(store, record)
                host.run_finished(spec, record)
            if spec.method == BASELINE and record["status"] == "ok":
                baselines[spec.seed] = record
            outcome = "done" if record["status"] == "ok" else f"FAILED: {record['error']}"
            progress(i, len(plan), spec.label, f"{outcome} ({record['wall_s']:.1f} s)")
            records.append(record)
            runs.expect(seconds_left(plan[i:], list(zip(plan, records)), trains))
            runs.advance()  # also ends a step of the run that a failure left open
    return records
