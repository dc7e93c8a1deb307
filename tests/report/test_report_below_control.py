"""det/seg: a fine-tuned row that ends more than the margin under the control is named in words
under the table, with the backbone saving it bought it with."""
from __future__ import annotations

from vitbench.report.below_control import MARGIN, below_control_lines

TUNED = {"trained": "fine-tuned", "dense_finetune": {"protocol": "all"}}


def _rec(method, box, backbone=1.705, **extra):
    return {"spec_id": method, "task": "det", "model": "mobilevit_xs", "method": method, "params": {},
            "seed": 0, "status": "ok", "box_map": box, "backbone_gmacs": backbone, **extra}


def test_a_fine_tuned_row_under_the_control_is_named_with_its_saving():
    rows = [_rec("baseline", 0.453), _rec("baseline+ft", 0.650, **TUNED),
            _rec("ltm", 0.389, backbone=1.473, **TUNED),
            _rec("dcs", 0.650 - MARGIN + 0.001, **TUNED),  # within the margin: matches the control
            _rec("tome", 0.40)]  # training-free: compared with the baseline, not the control
    lines = below_control_lines("det", ["baseline", "baseline+ft", "ltm (ratio=0.64)", "dcs", "tome"], rows)
    assert MARGIN == 0.02
    assert lines[0].startswith("**Below the control** (more than 0.02 under the baseline detector fine-tuned")
    assert lines[1:] == ["- ltm (ratio=0.64): Box mAP -0.261 against the control, at -13.6 % backbone GMACs.", ""]


def test_nothing_without_a_control_or_a_row_below_it():
    rows = [_rec("baseline", 0.453), _rec("ltm", 0.389, **TUNED)]
    assert below_control_lines("det", ["baseline", "ltm"], rows) == []
    rows.append(_rec("baseline+ft", 0.40, **TUNED))
    assert below_control_lines("det", ["baseline", "ltm", "baseline+ft"], rows) == []
