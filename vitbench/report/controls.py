"""Words under a table on whether each method beats the controls at its budget: a method beats a
control when its accuracy is higher by more than the 95 % interval of the difference
(docs/measuring.md, "Against the controls").

The interval of a difference of two single runs is the normal one of two proportions of images
(unpaired, so wider than a paired test on the same images would give); over seeds it is Welch's,
from the seeds' standard deviations, with Student's t at the smaller row's seeds less one.
A metric that is no proportion of images (mAP) of a single seed has no interval: the words
compare the values and say so.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any, Optional

from vitbench.report.row_facts import images
from vitbench.report.tables import accuracy_key, metric
from vitbench.report.task_shape import accuracy_column
from vitbench.host import get_host

__all__ = ["control_lines", "difference_interval", "is_control"]

Record = Mapping[str, Any]

_Z95 = NormalDist().inv_cdf(0.975)


def is_control(method: Any) -> bool:
    """Whether ``method`` is registered as a control (``MethodSpec.kind == "control"``)."""
    spec = get_host().catalogs["methods"].get(str(method))
    return getattr(spec, "kind", None) == "control"


def difference_interval(rec: Record, control: Record, key: str) -> Optional[float]:
    """The half-width of the 95 % interval of ``rec[key] - control[key]``, or ``None`` when the
    rows say too little (one seed of a metric that is no percentage of images)."""
    n_rec, n_ctl = int(rec.get("n_seeds") or 1), int(control.get("n_seeds") or 1)
    if n_rec > 1 and n_ctl > 1:
        sd_rec, sd_ctl = metric(rec, f"{key}_seed_std"), metric(control, f"{key}_seed_std")
        if sd_rec is None or sd_ctl is None:
            return None
        from scipy.stats import t

        return float(t.ppf(0.975, min(n_rec, n_ctl) - 1)) * math.sqrt(sd_rec ** 2 / n_rec + sd_ctl ** 2 / n_ctl)
    p, q, n, m = metric(rec, key), metric(control, key), images(rec), images(control)
    if not key.endswith("_pct") or p is None or q is None or not n or not m:
        return None
    p, q = p / 100, q / 100
    return 100 * _Z95 * math.sqrt(p * (1 - p) / n + q * (1 - q) / m)


def _budget(rec: Record) -> Optional[float]:
    fraction = rec.get("match_gmacs")
    return float(fraction) if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) else None


def _landed_off(rec: Record) -> Optional[float]:
    """How far (%) a row's GMACs landed from its budget, when outside the tolerance; else None."""
    budget = rec.get("budget") if isinstance(rec.get("budget"), Mapping) else {}
    off = budget.get("landed_off_pct")
    if budget.get("landed_within", True) or not isinstance(off, (int, float)):
        return None
    return float(off)


def _off(control: Record) -> str:
    """How far a control's GMACs landed from its budget, when outside the tolerance."""
    off = _landed_off(control)
    return "" if off is None else f", which ran at {off:+.1f} % of the budget's GMACs"


def _verdict(rec: Record, control: Record, key: str, unit: str) -> Optional[str]:
    a, b = metric(rec, key), metric(control, key)
    if a is None or b is None:
        return None
    diff, half = a - b, difference_interval(rec, control, key)
    name = str(control.get("method"))
    if half is None:
        beats = "beats" if diff > 0 else "**does not beat**"
        return f"{beats} {name} ({diff:+.2f} {unit}, no interval: one seed{_off(control)})"
    beats = "beats" if diff > half else "**is worse than**" if diff < -half else "**does not beat**"
    return f"{beats} {name} ({diff:+.2f} {unit}, 95 % interval ±{half:.2f}{_off(control)})"


def control_lines(task: str, labels: Sequence[str], rows: Sequence[Record]) -> list[str]:
    """A bullet per method row at a matched budget where a control ran at the same budget,
    saying which controls it beats; nothing without such pairs."""
    key = accuracy_key(task)
    column = accuracy_column(task, key)
    unit = "pp" if key.endswith("_pct") else "points"
    controls = [r for r in rows if is_control(r.get("method")) and _budget(r) is not None]
    found = []
    for lab, rec in zip(labels, rows):
        if _budget(rec) is None or is_control(rec.get("method")) or rec.get("method") in ("baseline", "baseline+ft"):
            continue
        said = [v for c in controls if _budget(c) == _budget(rec) and (v := _verdict(rec, c, key, unit))]
        if said:
            own = _landed_off(rec)
            away = "" if own is None else (f" (ran at {own:+.1f} % of the budget's GMACs, outside the tolerance: "
                                           f"**not at the controls' compute**)")
            found.append(f"- {lab}{away}: {'; '.join(said)}.")
    if not found:
        return []
    title = column.title.split(" (")[0]
    return ([f"**Against the controls** (the simple things a method must beat, at the same budget; a method "
             f"beats one when its {title} is higher by more than the 95 % interval of the difference):"]
            + found + [""])
