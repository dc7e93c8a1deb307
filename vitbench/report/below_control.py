"""A sentence under a det/seg table for each fine-tuned row that ends below the control: the
detector training it shares with the control does not make up for what the method changed
(docs/measuring.md, "Accuracy and mAP")."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vitbench.report.tables import pick_control
from vitbench.report.task_shape import accuracy_columns, task_spec
from vitbench.report.values import metric
from vitbench.task import CONTROL, report_words

__all__ = ["MARGIN", "below_control_lines"]

#: how far under the control's mAP a fine-tuned row may end and still be said to match it
MARGIN = 0.02


def _saved(rec: Mapping[str, Any], control: Mapping[str, Any]) -> str:
    """``", at -13.6 % backbone GMACs"`` (the control has the baseline's architecture), or nothing."""
    got, ref = metric(rec, "backbone_gmacs"), metric(control, "backbone_gmacs")
    return f", at {100 * (got / ref - 1):+.1f} % backbone GMACs" if got is not None and ref else ""


def _maps(rec: Mapping[str, Any]) -> str:
    """``"; the heads read its stride-16 map of 14x14 resized to 20x20, ..."`` (the recorded
    ``resized_maps``: what the method made smaller), or nothing."""
    maps = [m for m in rec.get("resized_maps") or [] if isinstance(m, Mapping)]
    words = [f"stride-{m.get('stride')} map of {'x'.join(map(str, m.get('size') or []))} resized to "
             f"{'x'.join(map(str, m.get('nominal') or []))}" for m in maps]
    return f"; the heads read its {' and its '.join(words)}" if words else ""


def below_control_lines(task: str, labels: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A bullet per row compared with the control (it fine-tuned detector weights as the control
    did; the control fine-tuned as long, where the rows hold one) whose mAP ends more than
    :data:`MARGIN` under the control's, under one heading; nothing without a control or such rows."""
    spec = task_spec(task)
    if pick_control(rows) is None or spec is None:
        return []
    found, several = [], sum(r.get("method") == CONTROL and r.get("status") == "ok" for r in rows)
    for lab, rec in zip(labels, rows):
        control = pick_control(rows, like=rec)  # the one fine-tuned as long as ``rec``, where there is one
        if rec.get("method") == CONTROL or not report_words(spec).compared_with_control(rec):
            continue
        said = [f"{col.title} {v - c:+.3f}" for col in accuracy_columns(task)
                if (v := metric(rec, col.key)) is not None and (c := metric(control, col.key)) is not None
                and v < c - MARGIN]
        if said:
            which = "the control" if several == 1 else f"the control {control.get('label') or CONTROL}"
            found.append(f"- {lab}: {', '.join(said)} against {which}{_saved(rec, control)}{_maps(rec)}.")
    if not found:
        return []
    return ([f"**Below the control** (more than {MARGIN} under the baseline detector fine-tuned with no method: "
             f"the detector training does not make up for what the method changed; mAP carries no interval "
             f"here, see Methodology):"] + found + [""])
