"""det/seg against silent garbage (issue 9 item 2): NaN features or losses stop evaluation and
training with a message naming the part, the loss term and where; the run is an error record
listed in the report."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.errors import NonFiniteError
from vitbench.tasks.dense.detectors import build_detector
from vitbench.tasks.dense.evaluate import evaluate_detector
from vitbench.tasks.dense.run import load_detector_weights
from vitbench.tasks.dense.train import finetune_method, train_detector

NAN = float("nan")


def _detector(backbone_factory, task="det"):
    detector = build_detector(task, backbone_factory("mobilevit_xs"), 3, width="light")
    detector.init_weights()
    return detector.eval()


def _poison_loss(detector, term="loss_cls"):
    """The detector's ``loss`` with one term turned into NaN."""
    loss = detector.loss

    def poisoned(*args, **kwargs):
        out = loss(*args, **kwargs)
        value = out[term]
        out[term] = [v * NAN for v in value] if isinstance(value, (list, tuple)) else value * NAN
        return out

    detector.loss = poisoned


@pytest.mark.parametrize("part, poison", [
    ("backbone", lambda d: d.backbone.model.stem.conv.weight),
    ("bbox_head", lambda d: d.bbox_head.cls_convs[0][0].conv.weight),
])
def test_non_finite_outputs_stop_the_map_evaluation(backbone_factory, det_data, part, poison):
    detector = _detector(backbone_factory)
    with torch.no_grad():
        poison(detector).fill_(NAN)
    hooks = sum(len(m._forward_hooks) for m in detector.modules())
    with pytest.raises(NonFiniteError, match=rf"^mAP evaluation: the outputs of the detector's {part} hold "
                                             r"non-finite values \(.* of \d+\) in batch 1$"):
        evaluate_detector(detector, det_data, masks=False, batch_size=2)
    assert sum(len(m._forward_hooks) for m in detector.modules()) == hooks  # the guards are removed again


def test_a_non_finite_loss_stops_the_default_detector_training(backbone_factory, det_data):
    detector = _detector(backbone_factory)
    _poison_loss(detector)
    with pytest.raises(NonFiniteError, match=r"^detector training: the loss became non-finite \(loss_cls = nan\) "
                                             r"in stage 'default training', epoch 1, iteration 1$"):
        train_detector(detector, det_data, masks=False, epochs=1, batch_size=2, verbose=False)


def test_a_non_finite_detection_loss_stops_method_fine_tuning_before_the_update(backbone_factory, det_data):
    backbone = backbone_factory("mobilevit_xs")
    baseline = _detector(lambda name: copy.deepcopy(backbone))
    reduced = vitbench.apply(backbone, "ltm", ratio=0.5, epochs=1, batch_size=2, stats_images=4, ib_weight=0.0)
    detector = build_detector("det", reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    _poison_loss(detector, "loss_bbox")
    before = {k: v.detach().clone() for k, v in detector.named_parameters()}
    with pytest.raises(NonFiniteError, match=r"^ltm: the loss became non-finite \(loss_bbox = nan\) "
                                             r"in stage 'finetune', epoch 1, iteration 1$"):
        finetune_method(detector, reduced, det_data, masks=False, limit=4)
    assert all(torch.equal(before[k], p) for k, p in detector.named_parameters())  # no weight was updated


def test_a_non_finite_detector_is_an_error_record_in_the_report(backbone_factory, det_data, tmp_path, monkeypatch):
    from vitbench.run.execute import run_spec
    from vitbench.run.plan import build_plan
    from vitbench.report.markdown import render_markdown
    from vitbench.tasks.dense import run as det_run
    from vitbench.tasks.dense.run import DenseWorkspace

    def diverged_training(ws, detector, seed):  # stands in for a default training that went to NaN
        with torch.no_grad():
            detector.bbox_head.reg_convs[0][0].conv.weight.fill_(NAN)
        return {"epochs": 1, "iters": 2, "images": 4, "batch_size": 8, "lr": 0.002, "seconds": 0.0}

    monkeypatch.setattr(det_run, "train_detector_weights", diverged_training)
    plan = build_plan(task="det", model="mobilevit_xs", methods=["tome"], data=str(det_data.root),
                      overrides={"tome": {"r": 2}}, metrics=("accuracy",), batch_size=2, device="cpu", seed=0)
    ws = DenseWorkspace(task="det", model=backbone_factory("mobilevit_xs"), model_name="mobilevit_xs",
                        data=det_data, width="light", epochs=1, verbose_training=False)
    records = [run_spec(spec, ws, None, {}, lambda what: None) for spec in plan]
    message = "mAP evaluation: the outputs of the detector's bbox_head hold non-finite values"
    assert [r["status"] for r in records] == ["error", "error"]
    assert all(r["error"].startswith(message) and r["error"].endswith("in batch 1") for r in records)
    report = render_markdown(records)
    assert "No successful runs." in report and f"- baseline: {message}" in report


def test_a_forward_that_loses_images_scores_no_map(backbone_factory, det_data):
    """The images a row was scored on are counted from the predictions the metric got (issue 37)."""
    from vitbench.errors import DataError

    detector = _detector(backbone_factory)
    predict = detector.predict
    detector.predict = lambda inputs, samples, **kw: predict(inputs[:1], samples[:1], **kw)  # type: ignore[method-assign]
    with pytest.raises(DataError, match=r"^the evaluation scored \d+ predictions for its \d+ images: the model's "
                                        r"forward changed the batch; no mAP is reported for it$"):
        evaluate_detector(detector, det_data, masks=False, batch_size=2)
