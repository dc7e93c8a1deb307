"""Timings not to be trusted, marked with :data:`MARK` in the table and explained under it
(docs/measuring.md, "Honest timings").

A throughput or latency is doubted when the record says so (``<timing>_flagged`` and
``<timing>_flag_reason``, written by :mod:`vitbench.measure.speed` with the load average
before/after, cores and threads), or, for a record written before those fields existed, when its
spread exceeds :data:`~vitbench.measure.speed.SPREAD_LIMIT` of its median. A speed-up or
efficiency is doubted when it was derived from a doubted throughput: the row's own, or that of
the baseline of the same seed; a paired speed-up (:mod:`vitbench.measure.paired`) by its own
rounds' spread and load. A speed-up above the ratio of the baseline's GMACs to the row's by more
than its spread is a measurement error (:func:`beyond_compute`). With several seeds a row is
marked when any seed's timing is, and the note says which seed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vitbench.measure.speed import timing_doubt
from vitbench.measure.speed import LOAD_MARGIN, SPREAD_LIMIT

__all__ = ["MARK", "RowDoubts", "beyond_compute", "drift_reason", "row_doubts", "timing_notes"]

#: appended to a doubted cell
MARK = "†"
Record = Mapping[str, Any]
_TIMINGS = {"throughput": ("throughput_img_s", "throughput_spread_img_s"),
            "latency": ("latency_ms", "latency_spread_ms"), "speedup": ("speedup", "speedup_spread"),
            "overhead": ("overhead_pct", "overhead_spread_pct")}


@dataclass
class RowDoubts:
    """Why a row's cells are marked: one line per doubted (seed, timing)."""

    throughput: list[str] = field(default_factory=list)
    latency: list[str] = field(default_factory=list)
    derived: list[str] = field(default_factory=list)  # speed-up / efficiency
    end_to_end: list[str] = field(default_factory=list)  # the evaluation's images per second
    overhead: list[str] = field(default_factory=list)  # the method's own time, timed in turn with its limit

    def __bool__(self) -> bool:
        return bool(self.throughput or self.latency or self.derived or self.end_to_end or self.overhead)


def _fmt_load(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def timing_reason(rec: Record, timing: str) -> str | None:
    """Why ``rec``'s ``timing`` ("throughput", "latency" or a paired "speedup") is doubted, with the facts it ran
    under (load before/after, cores, threads), or None when it is not."""
    median_key, spread_key = _TIMINGS[timing]
    if rec.get(median_key) is None:
        return None
    if f"{timing}_flagged" in rec:  # the measurement judged it with the load it saw
        reason = rec.get(f"{timing}_flag_reason") if rec.get(f"{timing}_flagged") else None
    else:  # an older record: its spread is all there is to judge
        reason = timing_doubt(rec.get(median_key), rec.get(spread_key), None, None, None)
    if not reason:
        return None
    facts = []
    if f"{timing}_load_before" in rec or f"{timing}_load_after" in rec:
        facts.append(f"1-min load average {_fmt_load(rec.get(f'{timing}_load_before'))} before, "
                     f"{_fmt_load(rec.get(f'{timing}_load_after'))} after")
    if rec.get(f"{timing}_cores"):
        facts.append(f"{rec[f'{timing}_cores']} cores")
    if rec.get(f"{timing}_threads"):
        facts.append(f"{rec[f'{timing}_threads']} threads")
    return reason + (f" ({', '.join(facts)})" if facts else "")


def _per_seed(row: Record) -> Sequence[Record]:
    return row.get("per_seed") or [row]


def drift_reason(control: Record | None, base: Record | None) -> str | None:
    """det/seg: the control row is the baseline's own architecture (the same GMACs), so its
    speed-up should be 1. When its throughput differs from the baseline's by more than
    :data:`~vitbench.measure.speed.SPREAD_LIMIT`, the machine's speed drifted between the
    measurements of this run (a shared VM's neighbours, frequency scaling: a drift the per-timing
    spread and load average cannot see), and every speed-up of the table is in doubt."""
    if control is None or base is None:
        return None
    c, b = control.get("throughput_img_s"), base.get("throughput_img_s")
    if not isinstance(c, (int, float)) or not isinstance(b, (int, float)) or not b:
        return None
    ratio = c / b
    if abs(ratio - 1.0) <= SPREAD_LIMIT:
        return None
    return (f"the control baseline+ft (the baseline's architecture and GMACs) ran at {ratio:.2f}x the "
            f"baseline's throughput (limit 1 ± {SPREAD_LIMIT:g}): the machine's speed drifted during this run")


def beyond_compute(rec: Record, base: Record | None) -> str | None:
    """Why ``rec``'s speed-up cannot be a measurement of the method: it exceeds, by more than
    its spread, the ratio of the baseline's GMACs to its own (a forward that does a fraction f of
    the work cannot take less than f of the time, up to noise); None when it does not, or when a
    count is missing."""
    speedup, gmacs, base_gmacs = rec.get("speedup"), rec.get("gmacs"), (base or {}).get("gmacs")
    if not all(isinstance(v, (int, float)) and v > 0 for v in (speedup, gmacs, base_gmacs)):
        return None
    bound, spread = base_gmacs / gmacs, rec.get("speedup_spread")
    if not isinstance(spread, (int, float)) or spread <= 0:  # a ratio of throughputs: their spreads add up
        spread = speedup * sum(_relative_spread(r) for r in (rec, base))
    if speedup - spread <= bound:
        return None
    return (f"its speed-up {speedup:.2f}x (spread {spread:.2f}) exceeds the {bound:.2f}x its GMACs allow "
            f"(baseline GMACs / its GMACs): a measurement error, not the method's")


def _relative_spread(rec: Record | None) -> float:
    tp, spread = (rec or {}).get("throughput_img_s"), (rec or {}).get("throughput_spread_img_s")
    ok = all(isinstance(v, (int, float)) and v > 0 for v in (tp, spread))
    return spread / tp if ok else 0.0


def row_doubts(row: Record, base: Record | None, control: Record | None = None) -> RowDoubts:
    """The doubts of an (aggregated, :mod:`vitbench.report.seeds`) row; ``base`` is the table's
    baseline row, whose per-seed throughputs the row's speed-ups were derived from; ``control``
    the det/seg control row, whose drift from the baseline (:func:`drift_reason`) puts every
    speed-up in doubt."""
    several = len(_per_seed(row)) > 1
    doubts = RowDoubts()
    drift = drift_reason(control, base)
    if drift and row is not base and any(r.get("throughput_img_s") is not None and not r.get("speedup_paired")
                                         for r in _per_seed(row)):
        doubts.derived.append(drift)
    base_by_seed = {r.get("seed"): r for r in _per_seed(base)} if base is not None else {}
    for rec in _per_seed(row):
        prefix = f"seed {rec.get('seed')}: " if several else ""
        for timing in ("throughput", "latency", "overhead"):
            reason = timing_reason(rec, timing)
            if reason:
                getattr(doubts, timing).append(prefix + reason)
        if rec.get("eval_img_s") is not None and rec.get("eval_flag_reason"):
            doubts.end_to_end.append(prefix + str(rec["eval_flag_reason"]))
        if row is base or rec.get("throughput_img_s") is None:
            continue  # the baseline's speed-up is 1 by definition; no throughput, no speed-up
        beyond = beyond_compute(rec, base_by_seed.get(rec.get("seed")))
        if beyond:
            doubts.derived.append(prefix + beyond)
        if rec.get("speedup_paired"):  # timed in turn with the baseline: judged by its own rounds
            reason = timing_reason(rec, "speedup")
            if reason:
                doubts.derived.append(prefix + f"timed in turn with the baseline: {reason}")
            continue
        if timing_reason(rec, "throughput"):
            doubts.derived.append(prefix + "derived from this row's marked throughput")
        b = base_by_seed.get(rec.get("seed"))
        if b is not None and timing_reason(b, "throughput"):
            doubts.derived.append(prefix + "derived from the baseline's marked throughput")
    return doubts


def timing_notes(labels: Sequence[str], doubts: Sequence[RowDoubts]) -> list[str]:
    """Markdown lines under a table saying, per marked row, which timing and why (empty when
    nothing is marked)."""
    items = []
    for label, d in zip(labels, doubts):
        items += [f"- {label}, throughput: {why}" for why in d.throughput]
        items += [f"- {label}, latency: {why}" for why in d.latency]
        items += [f"- {label}, speed-up and efficiency: {why}" for why in d.derived]
        items += [f"- {label}, end to end: {why}" for why in d.end_to_end]
        items += [f"- {label}, overhead: {why}" for why in d.overhead]
    if not items:
        return []
    head = (f"{MARK} Timing not to be trusted: its spread over repeats exceeded "
            f"{100 * SPREAD_LIMIT:.0f} % of its median, or the 1-minute load average before or after "
            f"exceeded the usable cores + {LOAD_MARGIN:g} (other work shared the CPU). Speed-up and "
            f"efficiency derived from such a throughput are marked too, and every speed-up when the "
            f"det/seg control (the baseline's own model) did not time within {100 * SPREAD_LIMIT:.0f} % "
            f"of the baseline; a speed-up timed in turn with the baseline is marked by its own rounds.")
    return [head, ""] + items + [""]
