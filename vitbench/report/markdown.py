"""The markdown report: environment, command, methodology, one table per (task, model).

Every report answers the questions users keep asking (per batch or per image? why no
speed-up? how were input-dependent FLOPs counted?) before the numbers, so the methodology
paragraph is part of the report, not of the docs (docs/measuring.md, "Report shape").
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vitbench.host.environment import DIRTY
from vitbench.report.batches import batch_lines
from vitbench.report.below_control import below_control_lines
from vitbench.report.data_words import data_words
from vitbench.report.doubts import row_doubts, timing_notes
from vitbench.report.measured_on import describe
from vitbench.report.methodology import PARAGRAPHS, methodology
from vitbench.report.row_facts import weights_from
from vitbench.report.controls import control_lines
from vitbench.report.slower import slower_lines
from vitbench.report.task_shape import task_spec
from vitbench.report.timed_how import timed_how_notes
from vitbench.report.unequal_compute import unequal_compute_lines
from vitbench.report.tables import (
    CONTROL,
    comparison_table, group_records, groups, measured_groups, metric, ok_rows, pick_control, row_labels,
)
from vitbench.report.words import distinct as _distinct
from vitbench.report.words import joined as _joined
from vitbench.results.store import latest_records
from vitbench.task import report_words

__all__ = ["render_markdown", "METHODOLOGY", "group_section", "header_lines"]

_VERSION_KEYS = ("torch", "timm", "mmengine", "mmcv", "mmdet", "mmpretrain", "vitbench")

#: every paragraph of the methodology; a report shows those of what it measured (:func:`methodology`)
METHODOLOGY = " ".join(text for _, text in PARAGRAPHS if text)


SEEDS_NOTE = (
    "Seeds: a row holds the runs that differ only by their seed (column Seeds, n runs). Accuracy, "
    "mAP and IB cells are the mean ± sample standard deviation over those seeds, and their deltas "
    "are against the baseline's mean; GMACs and parameters are means; throughput, latency, "
    "speed-up and efficiency are the median over seeds of the per-seed values, speed-up and "
    "efficiency each taken against the baseline of the same seed. The per-seed values are in "
    "runs.jsonl."
)


def _training_line(rec: Mapping[str, Any]) -> str:
    """``1 epoch(s) on 10000 training images, 95 s, 12,345 trainable parameters (backbone frozen)``."""
    if rec.get("trained") == "checkpoint":
        return f"reloaded from {rec.get('checkpoint_path')} (--resume)"
    if rec.get("trained") == "shipped":
        return (f"shipped weights {rec.get('shipped_weights')} (sha256 {str(rec.get('shipped_sha256'))[:12]}), "
                f"{rec.get('shipped_trained')}: their settings equal this run's, so it loaded them instead of "
                f"fine-tuning (when made: {float(rec.get('train_s') or 0):.0f} s, "
                f"{int(rec.get('trainable_params') or 0):,} trainable parameters, backbone frozen)")
    stages = rec.get("train_stages") or []
    if stages and all(not s.get("epochs") for s in stages):
        return (f"not trained (0 epochs): only the method's statistics/preparation callbacks ran "
                f"({float(rec.get('train_s') or 0):.0f} s)")
    parts = [f"{s.get('name')}: {s.get('epochs')} epoch(s), {s.get('iters')} iterations" if s.get("epochs")
             else f"{s.get('name')}: {_stage_notes(s) or 'no training'}" for s in stages]
    trained = "backbone trained" in str(rec.get("label")) or any(s.get("backbone") for s in stages)
    frozen = "backbone trained" if trained else "backbone frozen"
    spec = task_spec(str(rec.get("task")))  # det/seg: the dense fine-tuning protocol says what trained
    words = report_words(spec).training_words(rec, with_method=rec.get("method") != CONTROL) if spec is not None else None
    frozen = words or frozen
    per_seed = f" per seed (time: mean over {rec['n_seeds']} seeds)" if int(rec.get("n_seeds") or 1) > 1 else ""
    return (f"{'; '.join(parts)} on {rec.get('train_images')} training images in "
            f"{float(rec.get('train_s') or 0):.0f} s{per_seed}, {int(rec.get('trainable_params') or 0):,} "
            f"trainable parameters ({frozen})")


def _stage_notes(stage: Mapping[str, Any]) -> str:
    """What a stage's callbacks reported (its record's ``<name>_*`` keys): ``alpha 0.16, ratio 0.8``."""
    prefix = f"{stage.get('name')}_"
    return ", ".join(f"{k[len(prefix):].replace('_', ' ')} {v:.4g}" for k, v in stage.items()
                     if k.startswith(prefix) and isinstance(v, (int, float)))


def _one_line(text: Any, limit: int = 500) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _plugins(env: Mapping[str, Any]) -> str | None:
    plugins = env.get("plugins")
    if not plugins:
        return None
    names = []
    for p in plugins:
        if isinstance(p, Mapping):
            version = p.get("version")
            names.append(f"{p.get('name')} {version}" if version else str(p.get("name")))
        else:
            names.append(str(p))
    return ", ".join(sorted(names))


def _environment(records: list[Mapping[str, Any]]) -> list[str]:
    envs = [r.get("env") or {} for r in records]
    versions = []
    for key in _VERSION_KEYS:
        vals = _distinct((e.get("versions") or {}).get(key) for e in envs)
        versions.append(f"{key} {' / '.join(vals) if vals else 'n/a'}")
    lines = [f"- Versions: {', '.join(versions)}"]
    for label, key in (("Device", "device"), ("Threads", "threads"), ("Precision", "precision"),
                       ("Compiled", "compiled"), ("CUDA graph", "cuda_graph"), ("CPU kernels", "cpu_kernels"),
                       ("Allocator", "allocator"), ("Git revision", "git_rev")):
        if not any(key in e for e in envs):  # a fact older stores did not record (--compile)
            continue
        lines.append(f"- {label}: {_joined(_distinct(e.get(key) for e in envs))}")
    if any(str(e.get("git_rev") or "").endswith(DIRTY) for e in envs):
        lines.append(f"- Uncommitted code: a revision marked `{DIRTY}` ran with changes to vitbench's code "
                     "that its commit does not hold, so that commit alone may not give these numbers again")
    lines.append(f"- Plugins: {_joined(_distinct(_plugins(e) for e in envs))}")
    statuses = [str(r.get("status")) for r in records]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    lines.append(f"- Runs: {len(records)} ({counts})" if records else "- Runs: none")
    times = sorted(t for r in records for t in (r.get("started_at"), r.get("finished_at")) if t)
    if times:
        lines.append(f"- Measured: {times[0]} to {times[-1]}")
    return lines


def _chance_warnings(records: list[Mapping[str, Any]]) -> list[str]:
    """A baseline near chance accuracy usually means a wrong data layout, not a bad model."""
    out = []
    for task, model in groups(records):
        _, base = ok_rows(records, task, model)
        top1, n = metric(base, "top1_pct"), metric(base, "num_classes")
        if top1 is None or not n or n <= 0:
            continue
        chance = 100.0 / n
        if top1 <= 1.5 * chance:
            out.append(
                f"> **Warning:** the baseline of {task} / {model} reaches {top1:.2f}% top-1, near "
                f"chance ({chance:.2f}% for {int(n)} classes): check the data layout and labels."
            )
    return out


def _escape_cell(s: Any) -> str:
    return str(s).replace("|", "\\|")


def _head_fit(head: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells one fitted head from another (its size, images and saved weights)."""
    return head.get("num_classes"), head.get("train_images"), head.get("data"), head.get("checkpoint_path")


def _head_lines(rows: list[Mapping[str, Any]], base: Mapping[str, Any] | None) -> list[str]:
    """cls with ``--num-classes``: the classifier head the rows start from was fitted by vitbench;
    "the baseline and every method start from it" only where that is so."""
    heads = [r.get("head") if isinstance(r.get("head"), Mapping) else None for r in rows]
    head = next((h for h in heads if h), None)
    if not head:
        return []
    fitted = (f"a new {head.get('num_classes')}-way head, fitted once by a {head.get('method', 'linear probe')} "
              f"on {head.get('train_images')} training images of {head.get('data')} (train top-1 "
              f"{float(head.get('train_top1_pct') or 0):.2f} %)")
    if any(h is None or _head_fit(h) != _head_fit(head) for h in heads):
        return ["Classifier heads: the rows of this table do not all start from the same fitted head:"] + [
            f"- {lab}: " + (f"a {h.get('num_classes')}-way head fitted on {h.get('train_images')} training "
                            f"images (saved as {h.get('checkpoint_path')})" if h else "the model's own head")
            for lab, h in zip(row_labels(rows), heads)] + [""]
    who = ("the baseline and every method start from it" if base is not None else
           "every row of this table starts from it, and no baseline was measured with it")
    return [f"Classifier head: {fitted}; {who} (saved as {head.get('checkpoint_path')}).", ""]


def _weights_lines(task: str, rows: list[Mapping[str, Any]]) -> list[str]:
    """Where the rows' weights came from, as one line when every row shares it (else the table has
    a Weights column)."""
    found = {weights_from(r) for r in rows}
    if len(found) != 1:
        return []
    what = "Backbone weights" if task_spec(task) is not None and task_spec(task).info.counts == "backbone" else "Weights"
    shared = found.pop()
    if shared is None:
        return [f"{what}: n/a (not recorded by the vitbench version that measured these runs).", ""]
    return [f"{what} of every row: {shared}.", ""]


def _task_notes(task: str, rows: list[Mapping[str, Any]]) -> list[str]:
    """The task's own sentences under its table (det/seg: the detector and its training)."""
    spec = task_spec(task)
    notes = report_words(spec).report_notes(rows) if spec is not None else []
    return [" ".join(notes), ""] if notes else []


def _matched_lines(labels: list[str], rows: list[Mapping[str, Any]]) -> list[str]:
    """Matched compute (``--match-gmacs``, sweeps): per matched row, the knob value chosen, how,
    and where its GMACs landed against the target (learnable methods: after fine-tuning)."""
    matched = [(lab, r["budget"], bool(r.get("trained"))) for lab, r in zip(labels, rows)
               if isinstance(r.get("budget"), Mapping)]
    if not matched:
        return []
    fractions = _distinct(f"{b.get('fraction'):g}" for _, b, _ in matched)
    budget = _joined(fractions) if len(fractions) == 1 else "per row"
    tol = matched[0][1].get("tolerance_pct", 2)
    counted = "backbone GMACs" if any(b.get("counted") == "backbone" for _, b, _ in matched) else "GMACs"
    out = [f"Matched compute (F = {budget}): each method's budget knob was set so that its {counted} land "
           f"within {tol:g} % of F x the baseline's, counted as this table counts them.", ""]
    for lab, b, trained in matched:
        knob = f"{b.get('param')}={json.dumps(b.get('value'), separators=(',', ':'))}"
        target = float(b.get("target_gmacs") or 0)
        aim = f"target {target:.4g} GMACs (F = {float(b.get('fraction') or 0):g} of {float(b.get('baseline_gmacs') or 0):.4g})"
        if b.get("mode") == "fraction":
            how = f"{knob} set to F (the method's own budget parameter)"
        else:
            how = f"{knob} searched on the GMACs count ({b.get('counts')} settings evaluated)"
        if b.get("landed_gmacs") is None:
            landed = "GMACs not measured"
        else:
            after = "after fine-tuning " if trained else ""
            off = float(b.get("landed_off_pct") or 0)
            off = 0.0 if abs(off) < 0.05 else off  # no "-0.0 %"
            landed = f"landed {after}at {float(b['landed_gmacs']):.4g} GMACs, {off:+.1f} % from the target"
            if not b.get("landed_within"):
                landed += f" (**outside the {tol:g} % tolerance**"
                under = b.get("mode") == "search" and float(b.get("calibrated_off_pct") or 0) < -tol
                landed += ": its knob moves in steps, and the nearest setting under the budget was taken)" if under else ")"
        out.append(f"- {lab}: {how}; {aim}; {landed}.")
    return out + [""]


def group_section(records: list[Mapping[str, Any]], task: str, model: str,
                  heading: str | None = None) -> list[str]:
    """The markdown of one (task, model): its table, the notes under it, failed and skipped
    runs; ``heading`` replaces the ``## task · model`` title (a sweep's per-budget sections)."""
    recs = group_records(records, task, model)
    data = data_words(recs)
    head = heading or f"## {task} · {model}" + (f" (data: {data})" if data else "")
    lines = [head, ""]
    keys = measured_groups(records, task, model)
    if len(keys) == 1:
        lines += _table_lines(records, task, model, keys[0], several=False)
    elif keys:
        sub = "#" * (len(head) - len(head.lstrip("#")) + 1)
        lines += [f"These runs were measured on {len(keys)} different sets of evaluation images, classifier "
                  f"heads or weights, one table each: a row is compared only with the baseline measured on "
                  f"the same ones.", ""]
        for key in keys:
            lines += [f"{sub} Measured on {describe(key)}", ""]
            lines += _table_lines(records, task, model, key, several=True)
    else:
        lines += ["No successful runs.", ""]
    for status, title, default in (("error", "Failed runs", "(no message)"),
                                   ("skipped", "Skipped runs", "(no reason given)")):
        bad = [r for r in recs if r.get("status") == status]
        if bad:
            lines += [f"{title}:", ""]
            several = len({r.get("seed") for r in recs}) > 1
            for lab, r in zip(row_labels(bad), bad):
                lab = f"{lab} [seed={r.get('seed')}]" if several and "[seed=" not in lab else lab
                lines.append(f"- {lab}: {_one_line(r.get('error') or default)}")
            lines.append("")
    return lines


def _table_lines(records: list[Mapping[str, Any]], task: str, model: str, key: str, several: bool) -> list[str]:
    """The table of the runs measured on ``key`` (:func:`measured_groups`) and the notes under it."""
    rows, base = ok_rows(records, task, model, on=key)
    df = comparison_table(records, task, model, on=key).map(_escape_cell)
    align = ("left",) + ("right",) * (len(df.columns) - 1)  # numbers line up
    lines = [df.to_markdown(index=False, disable_numparse=True, colalign=align), ""]
    if base is None and several:
        lines += ["No successful baseline was measured on these images, head and weights, so this table "
                  "shows no deltas: a row is compared only with a baseline measured on the same ones.", ""]
    elif base is None:
        lines += ["No successful baseline in this group: deltas and speed-ups are n/a.", ""]
    lines += unequal_compute_lines(task, row_labels(rows), rows)
    lines += slower_lines(row_labels(rows), rows, base)
    lines += batch_lines(row_labels(rows), rows, base)
    lines += control_lines(task, row_labels(rows), rows)
    lines += below_control_lines(task, row_labels(rows), rows)
    lines += _weights_lines(task, rows)
    lines += _matched_lines(row_labels(rows), rows)
    control = pick_control(rows)  # det/seg only: no cls run has one
    lines += timing_notes(row_labels(rows), [row_doubts(r, base, control) for r in rows])
    lines += timed_how_notes(row_labels(rows), rows)
    if any(int(r.get("n_seeds") or 1) > 1 for r in rows):
        lines += [SEEDS_NOTE, ""]
    lines += _head_lines(rows, base)
    lines += _task_notes(task, rows)
    kernels = [(lab, _kernel(r)) for lab, r in zip(row_labels(rows), rows)]
    known = [(lab, k) for lab, k in kernels if k]
    if known and len({k for _, k in known}) == 1 and len(known) == len(kernels):
        lines += [f"Attention kernel: {known[0][1]} in every row.", ""]
    elif known:
        lines += ["Attention kernel:"] + [f"- {lab}: {k or 'n/a'}" for lab, k in kernels] + [""]
    trained = [(lab, r) for lab, r in zip(row_labels(rows), rows) if r.get("trained")]
    if trained:
        lines += ["Fine-tuning (learnable methods and the det/seg control, before measuring):"]
        lines += [f"- {lab}: {_training_line(r)}" for lab, r in trained] + [""]
    return lines


def _kernel(rec: Mapping[str, Any]) -> str | None:
    """A row's attention kernel, with the fused kernel PyTorch chose where the run recorded it."""
    kernel, backend = rec.get("attention_kernel"), rec.get("sdpa_backend")
    return f"{kernel}: {backend}" if kernel and backend else kernel


def header_lines(records: list[Mapping[str, Any]], *, title: str | None = None,
                 command: str | None = None, skipped: Sequence[str] = ()) -> list[str]:
    """The title, chance warnings, the store's skipped lines, environment, commands and
    methodology of a report."""
    lines = [f"# {title or 'vitbench report'}", ""]
    if skipped:
        lines += [f"**{len(skipped)} line(s) of the store are no run record and were skipped:**", ""]
        lines += [f"- `{line}`" for line in skipped] + [""]
    warnings = _chance_warnings(records)
    if warnings:
        lines += warnings + [""]
    lines += ["## Environment", ""] + _environment(records) + [""]
    run_commands = [(r.get("env") or {}).get("command") for r in records]
    commands = _distinct(
        shlex.join(map(str, c)) if isinstance(c, (list, tuple)) else c
        for c in [command, *run_commands]
    )
    if commands:
        lines += ["## Command", "", "```"] + commands + ["```", ""]
    lines += ["## Methodology", "", methodology(records), ""]
    return lines


def render_markdown(records: Iterable[Mapping[str, Any]], *, title: str | None = None,
                    command: str | None = None, plot_path: str | None = None, skipped: Sequence[str] = (),
                    batch_plot_path: str | None = None) -> str:
    """The whole report as markdown. ``command`` is shown first under "Command", then the run
    commands recorded in the records' ``env``; ``plot_path`` (relative to the markdown) adds
    the plot image link, ``batch_plot_path`` that of the speed-up against batch size."""
    records = latest_records(records)
    lines = header_lines(records, title=title, command=command, skipped=skipped)
    for task, model in groups(records):
        lines += group_section(records, task, model)
    if plot_path:
        lines += ["## Plot", "", f"![Accuracy vs GMACs and vs throughput]({plot_path})", ""]
    if batch_plot_path:
        lines += ["## Speed-up against batch size", "", f"![Speed-up over the baseline against batch size]"
                  f"({batch_plot_path})", ""]
    return "\n".join(lines)
