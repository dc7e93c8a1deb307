"""The dense fine-tuning protocol (issue 9, item 3): ``all`` trains every detector weight with
the method, ``heads`` the neck and heads with the backbone bitwise frozen, ``method`` only the
method's parameters; the record and the report say which; a bad name is a clear error."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.cli.main import main
from vitbench.errors import UnknownNameError
from vitbench.run.plan import build_plan
from vitbench.report.markdown import render_markdown
from vitbench.tasks.dense.detectors import build_detector
from vitbench.tasks.dense.protocol import (
    CONTROL,
    DEFAULT_PROTOCOL,
    DENSE_EPOCHS,
    DETECTOR_LR,
    PROTOCOLS,
    DenseFinetune,
    check_protocol,
    dense_finetune_for,
    detector_parameters,
    describe,
)
from vitbench.tasks.dense.run import load_detector_weights
from vitbench.tasks.dense.train import finetune_method

#: LTM at a small ratio, without its IB term (fast; the IB path is tested in test_det_train)
LTM = {"ratio": 0.5, "epochs": 1, "batch_size": 2, "stats_images": 4, "ib_weight": 0.0}


def _reduced_detector(backbone_factory, task="det"):
    """A baseline detector's weights (initialised as the default training starts) loaded into
    one around an LTM-reduced backbone."""
    backbone = backbone_factory("mobilevit_xs")
    baseline = build_detector(task, copy.deepcopy(backbone), 3, width="light")
    baseline.init_weights()
    reduced = vitbench.apply(backbone, "ltm", **LTM)
    detector = build_detector(task, reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    return detector, reduced


def _state(detector) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in detector.state_dict().items()}


def _changed(before, after, keys) -> set[str]:
    return {k for k in keys if not torch.equal(before[k], after[k])}


def _parts(detector) -> dict[str, set[str]]:
    """State keys by part: the method's, the timm backbone's weights and BatchNorm statistics,
    and the rest of the detector's weights and statistics (neck, heads)."""
    keys = detector.state_dict().keys()
    float_keys = {k for k in keys if detector.state_dict()[k].is_floating_point()}
    method = {k for k in float_keys if ".reducer." in k}
    backbone = {k for k in float_keys - method if k.startswith("backbone.model.")}
    return {"method": method,
            "backbone_weights": {k for k in backbone if not k.endswith(("running_mean", "running_var"))},
            "backbone_bn": {k for k in backbone if k.endswith(("running_mean", "running_var"))},
            "heads": float_keys - method - backbone}


def _finetune(backbone_factory, det_data, protocol, epochs=1):
    detector, reduced = _reduced_detector(backbone_factory)
    before = _state(detector)
    settings = DenseFinetune(protocol, epochs=epochs, detector_lr=1e-2)
    info = finetune_method(detector, reduced, det_data, masks=False, limit=4, settings=settings)
    return detector, before, _state(detector), info


def test_heads_trains_the_method_neck_and_heads_and_keeps_the_backbone_bitwise(backbone_factory, det_data):
    detector, before, after, info = _finetune(backbone_factory, det_data, "heads")
    parts = _parts(detector)
    assert parts["backbone_bn"] and parts["heads"] and parts["method"]
    assert _changed(before, after, parts["backbone_weights"] | parts["backbone_bn"]) == set()
    assert _changed(before, after, parts["method"])
    changed_heads = _changed(before, after, parts["heads"])
    assert any(k.startswith("neck.") for k in changed_heads) and any(k.startswith("bbox_head.") for k in changed_heads)
    # the neck's and heads' BatchNorm statistics follow the new maps
    assert any(k.endswith("running_mean") for k in changed_heads)
    assert info["dense_finetune"] == {"protocol": "heads", "bn_stats": "frozen in the backbone, updated in the "
                                      "neck and heads", "min_epochs": 1, "detector_lr": 1e-2}
    assert not any(p.requires_grad is False for p in detector.parameters())  # flags restored


def test_all_trains_every_detector_weight_and_updates_batchnorm(backbone_factory, det_data):
    detector, before, after, info = _finetune(backbone_factory, det_data, "all")
    parts = _parts(detector)
    for part in ("method", "backbone_weights", "backbone_bn", "heads"):
        assert _changed(before, after, parts[part]), part
    assert info["dense_finetune"]["protocol"] == "all" and info["dense_finetune"]["bn_stats"] == "updated"
    n_detector = sum(p.numel() for n, p in detector.named_parameters() if ".reducer." not in n)
    assert info["trainable_params"] > n_detector


def test_method_trains_only_the_method(backbone_factory, det_data):
    detector, before, after, info = _finetune(backbone_factory, det_data, "method", epochs=3)
    parts = _parts(detector)
    assert _changed(before, after, parts["method"])
    assert _changed(before, after, parts["backbone_weights"] | parts["backbone_bn"] | parts["heads"]) == set()
    assert info["dense_finetune"] == {"protocol": "method", "bn_stats": "frozen"}
    assert info["train_stages"][0]["epochs"] == 1  # the method's own epochs: no detector to adapt


def test_detector_weights_stretch_the_last_stage_and_get_their_own_lr(backbone_factory, det_data):
    """With detector weights training, the method's stage runs at least the protocol's epochs."""
    detector, reduced = _reduced_detector(backbone_factory)
    info = finetune_method(detector, reduced, det_data, masks=False, limit=4,
                           settings=DenseFinetune("heads", epochs=2, detector_lr=1e-3))
    stage = info["train_stages"][0]
    assert stage["epochs"] == 2 and stage["iters"] == 4  # 4 images, batch 2, 2 epochs


def test_a_two_stage_method_stretches_only_its_last_stage(backbone_factory, det_data):
    """DCS searches, then retrains: with detector weights training, the retrain (the last stage
    with epochs) runs the protocol's epochs and the search its own, not the other way round."""
    backbone = backbone_factory("mobilevit_xs")
    baseline = build_detector("det", copy.deepcopy(backbone), 3, width="light")
    baseline.init_weights()
    reduced = vitbench.apply(backbone, "dcs", arch="both", search_epochs=1, retrain_epochs=1, batch_size=2)
    detector = build_detector("det", reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    info = finetune_method(detector, reduced, det_data, masks=False, limit=4,
                           settings=DenseFinetune("heads", epochs=2, detector_lr=1e-3))
    assert [(s["name"], s["epochs"], s["iters"]) for s in info["train_stages"]] == [
        ("search", 1, 2), ("retrain", 2, 4)]


def test_detector_parameters_by_protocol(backbone_factory):
    detector, _ = _reduced_detector(backbone_factory)
    names = {n for n, _ in detector.named_parameters()}
    method = {n for n in names if ".reducer." in n}
    backbone = {n for n in names - method if n.startswith("backbone.model.")}
    strip = lambda d: {k.removeprefix("detector.") for k in d}  # noqa: E731
    assert strip(detector_parameters(detector, "all")) == names - method
    assert strip(detector_parameters(detector, "heads")) == names - method - backbone
    assert detector_parameters(detector, "method") == {}


def test_defaults_per_task():
    assert DEFAULT_PROTOCOL == "all" and PROTOCOLS == ("all", "heads", "method")
    for task in ("det", "seg"):
        settings = dense_finetune_for(task, DEFAULT_PROTOCOL)
        assert settings.epochs == DENSE_EPOCHS[task] and settings.detector_lr == DETECTOR_LR
        assert settings.trains_detector
    assert dense_finetune_for("det", "method").record() == {"protocol": "method", "bn_stats": "frozen"}


@pytest.mark.parametrize("bad", ["bogus", "", "ALL"])
def test_bad_protocol_is_a_clear_error(bad):
    message = f"unknown dense fine-tuning protocol {bad!r}; valid dense fine-tuning protocols: all, heads, method"
    with pytest.raises(UnknownNameError) as err:
        check_protocol(bad)
    assert str(err.value) == message
    with pytest.raises(UnknownNameError):
        DenseFinetune(bad)


def test_bad_protocol_on_the_command_line_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main(["run", "--task", "det", "--methods", "ltm", "--dense-finetune", "neck", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown dense fine-tuning protocol 'neck'; valid dense fine-tuning protocols: all, heads, method" in err
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("argv, message", [
    (["--task", "det", "--train-backbone", "--dense-finetune", "heads"], "contradicts --dense-finetune heads"),
    (["--task", "cls", "--dense-finetune", "all"], "--dense-finetune is an option of --task det, seg; --task is 'cls'"),
    (["--task", "cls", "--no-control"], "--no-control is an option of --task det, seg; --task is 'cls'"),
])
def test_contradicting_options_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main(["run", "--methods", "ltm", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_plan_carries_the_protocol_to_learnable_specs_only():
    plan = build_plan(task="det", model="mobilevit_xs", methods=["tome", "ltm"], data="shapes-coco",
                      overrides={}, metrics=("accuracy",), batch_size=2, device="cpu", seed=0,
                      dense_finetune="heads")
    base, control, tome, ltm = plan
    assert base.dense_finetune is None and tome.dense_finetune is None and ltm.dense_finetune == "heads"
    assert ltm.label == "ltm (ratio=0.7, fine-tuned: heads)"  # the knob at its default too
    # the control: the baseline detector fine-tuned under the same protocol, no method
    assert control.method == CONTROL and control.params == {} and control.dense_finetune == "heads"
    assert control.label == "baseline+ft (fine-tuned: heads)"
    default = build_plan(task="det", model="mobilevit_xs", methods=["ltm"], data="shapes-coco", overrides={},
                         metrics=("accuracy",), batch_size=2, device="cpu", seed=0, dense_finetune="all")
    assert [s.label for s in default] == ["baseline", "baseline+ft", "ltm (ratio=0.7)"]
    assert default[2].spec_id != ltm.spec_id and default[1].spec_id != control.spec_id


@pytest.mark.parametrize("methods, protocol, control", [
    (["tome"], "all", False),  # nothing fine-tunes: no control
    (["ltm"], "method", False),  # no detector weight trains: the baseline detector is the control
    (["ltm"], "all", True),
    (["tome", "dcs"], None, True),  # the library's default protocol (all)
])
def test_the_control_is_planned_when_detector_weights_train(methods, protocol, control):
    plan = build_plan(task="det", model="mobilevit_xs", methods=methods, data="shapes-coco", overrides={},
                      metrics=("accuracy",), batch_size=2, device="cpu", seed=0, dense_finetune=protocol)
    assert (CONTROL in [s.method for s in plan]) is control
    off = build_plan(task="det", model="mobilevit_xs", methods=methods, data="shapes-coco", overrides={},
                     metrics=("accuracy",), batch_size=2, device="cpu", seed=0, dense_finetune=protocol, control=False)
    assert CONTROL not in [s.method for s in off]


def test_the_control_stage_trains_the_detector_as_a_method_stage_does():
    """The control's stage is the detector half of a method's last dense stage: the same
    epochs, optimiser, schedule, weight decay, detector learning rate and batch."""
    from vitbench.catalog import TrainStage
    from vitbench.tasks.dense.protocol import stage_for
    from vitbench.tasks.dense.train import CONTROL_BATCH, control_stage

    settings = dense_finetune_for("seg", "all")
    control = control_stage(settings)
    method = stage_for(TrainStage(epochs=2, lr=0.3, batch_size=64, lr_groups=((".reducer.mlp.", 0.0),)),
                       settings, last=True)
    assert control.epochs == method.epochs == DENSE_EPOCHS["seg"]
    assert (control.optimizer, control.schedule, control.weight_decay) == (method.optimizer, method.schedule,
                                                                          method.weight_decay)
    assert control.lr_groups[0] == method.lr_groups[0] == ("detector.", DETECTOR_LR)
    assert control.extra_loss is None and not control.before and not control.after
    assert CONTROL_BATCH == max(2, min(method.batch_size, 8))


def _record(method, box_map, **extra):
    return {"spec_id": method, "task": "det", "model": "mobilevit_xs", "data": "shapes-coco", "method": method,
            "label": method, "params": {}, "seed": 0, "status": "ok", "error": None, "box_map": box_map,
            "detector": "SSDLite (SSDNeck + depthwise SSDHead), light heads, 320x320",
            "detector_training": {"epochs": 8, "iters": 200, "images": 200, "batch_size": 8, "lr": 0.002,
                                  "seconds": 1.0}, **extra}


def test_report_states_the_protocol():
    ltm = _record("ltm", 0.40, trained="fine-tuned", train_s=10.0, train_images=200, trainable_params=1000,
                  train_stages=[{"name": "finetune", "epochs": 3, "iters": 75}],
                  dense_finetune=dense_finetune_for("det", "all").record())
    text = render_markdown([_record("baseline", 0.42), ltm])
    words = describe(ltm["dense_finetune"])
    assert words.startswith("`all`: method parameters + every detector weight (backbone, neck, heads)")
    assert "BatchNorm statistics updated" in words and f"lr {DETECTOR_LR:g}" in words
    assert f"dense fine-tuning protocol {words}." in text  # the Detector: paragraph
    assert f"trainable parameters ({words})" in text  # the fine-tuning line


def test_report_compares_fine_tuned_rows_with_the_control():
    """ΔBox mAP stays against the baseline detector; "vs +ft" puts a fine-tuned row against the
    control (same detector training) and is n/a for a training-free row."""
    from vitbench.report.tables import comparison_table

    tuned = dict(trained="fine-tuned", train_s=10.0, train_images=200, trainable_params=1000,
                 train_stages=[{"name": "finetune", "epochs": 8, "iters": 200}],
                 dense_finetune=dense_finetune_for("det", "all").record())
    recs = [_record("baseline", 0.44), _record(CONTROL, 0.57, **tuned), _record("tome", 0.43),
            _record("ltm", 0.40, **tuned)]
    df = comparison_table(recs, "det", "mobilevit_xs").set_index("Method")
    assert list(df.index) == ["baseline", CONTROL, "tome", "ltm"]
    assert list(df["ΔBox mAP"]) == ["0.000", "+0.130", "-0.010", "-0.040"]
    assert list(df["ΔBox mAP vs +ft"]) == ["n/a", "0.000", "n/a", "-0.170"]
    text = render_markdown(recs)
    assert "ΔBox mAP vs +ft" in text and "baseline+ft: the baseline detector fine-tuned as" in text
    assert "(the same protocol, learning rate and batch; 8 epoch(s))" in text
    assert "differs from the control" not in text  # ltm's detector trained as long
    assert "trainable parameters (`all`: every detector weight (backbone, neck, heads)" in text  # the control's line
    # without a control the column is left out
    assert "ΔBox mAP vs +ft" not in comparison_table([recs[0], recs[3]], "det", "mobilevit_xs").columns


def test_report_names_a_method_whose_detector_trained_longer_than_the_control():
    """DCS with ``arch=both`` trains its detector in the search stage too (1 + 8 epochs against
    the control's 8); a raised ``ltm.epochs`` runs its last stage longer: the report says so
    beside "vs +ft"."""
    def tuned(*stages):
        return dict(trained="fine-tuned", train_s=10.0, train_images=200, trainable_params=1000,
                    train_stages=[{"name": n, "epochs": e, "iters": 25 * e} for n, e in stages],
                    dense_finetune=dense_finetune_for("det", "all").record())

    recs = [_record("baseline", 0.44), _record(CONTROL, 0.57, **tuned(("control", 8))),
            _record("dcs", 0.50, **tuned(("search", 1), ("retrain", 8))),
            _record("ltm", 0.40, **tuned(("finetune", 8)))]
    text = render_markdown(recs)
    assert ("Detector training that differs from the control's -- dcs: 9 epoch(s) (search 1, retrain 8) against 8: "
            "their \"vs +ft\" delta includes that difference") in text
    assert "ltm: 8" not in text
