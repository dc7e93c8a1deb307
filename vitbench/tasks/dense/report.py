"""What the report says under a det/seg table (:meth:`vitbench.task.TaskReport.report_notes`): the
detector, its baseline training, what GMACs cover, the dense fine-tuning protocol and the control."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vitbench.report.tables import pick_control, trained_epochs
from vitbench.report.words import distinct, joined
from vitbench.task import CONTROL
from vitbench.tasks.dense.protocol import describe

__all__ = ["detector_epochs", "detector_notes", "finetunes_detector"]


def finetunes_detector(rec: Mapping[str, Any]) -> bool:
    """Whether ``rec`` fine-tuned detector weights (a learnable method under protocol ``all`` or
    ``heads``, or the control): the rows compared with the control."""
    settings = rec.get("dense_finetune")
    return bool(rec.get("trained")) and isinstance(settings, Mapping) and settings.get("protocol") in ("all", "heads")


def detector_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Which detector, how its baseline was trained, what GMACs cover (docs/measuring.md: GMACs of
    the detector at its input size, backbone and full detector both stated), the dense
    fine-tuning protocol and the control row: the sentences under a det/seg table."""
    detectors = distinct(r.get("detector") for r in rows)
    if not detectors:
        return []
    train = next((r.get("detector_training") for r in rows if r.get("detector_training")), None) or {}
    size = joined(distinct(r.get("gmacs_input") for r in rows))
    out = [f"Detector: {joined(detectors)}. Box/mask mAP, AP50, AP75: mmdet CocoMetric on the "
           f"validation split (COCO 0..1 scale). GMACs: the whole detector's tensor forward (backbone, "
           f"neck, heads; no NMS) at {size}; Backbone GMACs: the backbone alone on the same images. "
           f"Throughput, latency: the detector's tensor forward."]
    if train.get("epochs"):
        out.append(f"Baseline detector: trained once, every weight, {train['epochs']} epoch(s) "
                   f"({train.get('iters', '?')} iterations on {train.get('images', '?')} images, batch "
                   f"{train.get('batch_size', '?')}, AdamW lr {train.get('lr', '?')}, "
                   f"{float(train.get('seconds', 0)):.0f} s); every method is applied to its backbone.")
    protocols = distinct(describe(r.get("dense_finetune")) for r in rows if r.get("trained"))
    if protocols:
        out.append(f"Learnable methods are fine-tuned on the detection loss inside it, dense fine-tuning "
                   f"protocol {joined(protocols)}.")
    controls = [r for r in rows if r.get("method") == CONTROL and r.get("status") == "ok"]
    if controls:
        epochs = ", ".join(distinct(str(detector_epochs(c)[0]) for c in controls))
        each = "; each row against the control trained as many epochs, where there is one" if len(controls) > 1 else ""
        out.append(f"{CONTROL}: the baseline detector fine-tuned as the learnable methods' detectors are "
                   f"(the same protocol, learning rate and batch; {epochs} epoch(s)), with no method -- the "
                   f"control for the extra detector training; \"vs +ft\" columns: a fine-tuned row's mAP minus "
                   f"the control's (the fair delta of a learnable method; ΔBox mAP is against the baseline "
                   f"detector, which trained less{each}).")
        differ = [(r, *detector_epochs(r), detector_epochs(pick_control(rows, like=r))[0]) for r in rows
                  if r.get("method") != CONTROL and finetunes_detector(r)]
        differ = [(r, n, how, ref) for r, n, how, ref in differ if n != ref]
        if differ:
            listed = "; ".join(f"{r.get('label') or r.get('method')}: {n} epoch(s) ({how}) against {ref}"
                               for r, n, how, ref in differ)
            out.append(f"Detector training that differs from the control's -- {listed}: "
                       f"their \"vs +ft\" delta includes that difference (a method's detector trains in "
                       f"every stage of the method, its last stage at least the protocol's epochs; "
                       f"--finetune-epochs trains the control as long).")
    notes = distinct((r.get("detector_training") or {}).get("provenance") for r in rows)
    out += [f"Note on the trained detector: {n}." for n in notes]
    return out


def detector_epochs(rec: Mapping[str, Any]) -> tuple[int, str]:
    """The epochs in which a fine-tuned row's detector weights trained (every recorded
    stage's), and per stage in words (``search 1, retrain 8``)."""
    stages = [s for s in rec.get("train_stages") or [] if s.get("epochs")]
    return trained_epochs(rec), ", ".join(f"{s.get('name', '?')} {s['epochs']}" for s in stages)
