"""``--finetune-epochs`` (issue 40): the dense fine-tuning runs N epochs for the control and at
least N for a learnable method's last stage, so that a longer method run has a control trained
as long; the plan, the labels and the report's "vs +ft" follow it; bad values exit 2. And the
report's words for a row below the control: which maps its method made smaller."""
from __future__ import annotations

import pytest

from vitbench.catalog import TrainStage
from vitbench.cli.main import main
from vitbench.errors import VitbenchError
from vitbench.report.below_control import below_control_lines
from vitbench.report.markdown import render_markdown
from vitbench.report.tables import comparison_table, pick_control
from vitbench.run.plan import build_plan
from vitbench.tasks.dense.protocol import CONTROL, DENSE_EPOCHS, check_finetune_epochs, dense_finetune_for, stage_for
from vitbench.tasks.dense.train import control_stage


def _plan(**fields):
    return build_plan(task="det", model="mobilevit_xs", methods=["tome", "ltm"], data="shapes-coco", overrides={},
                      metrics=("accuracy",), batch_size=2, device="cpu", seed=0, dense_finetune="all", **fields)


def test_the_control_and_the_last_stage_run_the_given_epochs():
    settings = dense_finetune_for("det", "all", 16)
    assert settings.epochs == 16 and settings.record()["min_epochs"] == 16
    assert control_stage(settings).epochs == 16
    assert stage_for(TrainStage(epochs=2), settings, last=True).epochs == 16  # LTM's own 2 raised
    assert stage_for(TrainStage(epochs=32), settings, last=True).epochs == 32  # a longer stage kept
    assert stage_for(TrainStage(epochs=1), settings, last=False).epochs == 1  # earlier stages their own
    assert dense_finetune_for("seg", "heads", None).epochs == DENSE_EPOCHS["seg"]


@pytest.mark.parametrize("bad", [0, -3, True, 2.5])
def test_bad_epochs_are_a_clear_error(bad):
    with pytest.raises(VitbenchError, match=rf"--finetune-epochs {bad!r} is out of range; it must be an integer >= 1"):
        check_finetune_epochs(bad)


def test_the_plan_carries_the_epochs_to_the_control_and_the_learnable_methods():
    base, control, tome, ltm = _plan(finetune_epochs=16)
    assert control.method == CONTROL and control.finetune_epochs == 16 and ltm.finetune_epochs == 16
    assert base.finetune_epochs is None and tome.finetune_epochs is None  # nothing of theirs fine-tunes
    assert control.label == "baseline+ft (fine-tuned 16 epochs)"
    assert ltm.label == "ltm (ratio=0.7, fine-tuned 16 epochs)"
    default = _plan()
    assert default[1].finetune_epochs is None and default[1].label == CONTROL
    assert default[1].spec_id != control.spec_id and default[3].spec_id != ltm.spec_id
    assert default[0].spec_id == base.spec_id and default[2].spec_id == tome.spec_id  # reused by --resume
    assert _plan(finetune_epochs=None)[1].spec_id == default[1].spec_id  # unset: the ids of before


@pytest.mark.parametrize("argv, message", [
    (["--finetune-epochs", "0"], "--finetune-epochs 0 is out of range; it must be an integer >= 1"),
    (["--finetune-epochs", "4", "--dense-finetune", "method"], "--dense-finetune method trains none"),
])
def test_bad_values_on_the_command_line_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main(["run", "--task", "det", "--methods", "ltm", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "cache").exists()


def _record(method, label, box_map, epochs=None, stage=None):
    rec = {"spec_id": label, "task": "det", "model": "mobilevit_xs", "data": "shapes-coco", "method": method,
           "label": label, "params": {}, "seed": 0, "status": "ok", "error": None, "box_map": box_map,
           "backbone_gmacs": 1.7 if method in ("baseline", CONTROL) else 1.47,
           "detector": "SSDLite (SSDNeck + depthwise SSDHead), light heads, 320x320",
           "detector_training": {"epochs": 8, "iters": 200, "images": 200, "batch_size": 8, "lr": 0.002,
                                 "seconds": 1.0}}
    if epochs is not None:
        settings = dense_finetune_for("det", "all", epochs)
        rec.update(trained="fine-tuned", train_s=1.0, train_images=200, trainable_params=10,
                   dense_finetune=settings.record(),
                   train_stages=[{"name": stage or "finetune", "epochs": max(epochs, settings.epochs)}])
    return rec


def test_each_row_is_compared_with_the_control_fine_tuned_as_long():
    """A store holding the default control (8 epochs) and one of ``--finetune-epochs 16``: each
    fine-tuned row's "vs +ft" and "Below the control" use the control trained as many epochs."""
    rows = [_record("baseline", "baseline", 0.45),
            _record(CONTROL, CONTROL, 0.65, epochs=8, stage="control"),
            _record("ltm", "ltm (ratio=0.64)", 0.60, epochs=8),
            _record(CONTROL, "baseline+ft (fine-tuned 16 epochs)", 0.75, epochs=16, stage="control"),
            _record("ltm", "ltm (ratio=0.64, fine-tuned 16 epochs)", 0.74, epochs=16),
            _record("ltm", "ltm (ratio=0.64, epochs=16)", 0.70, epochs=8)]
    rows[5]["train_stages"] = [{"name": "finetune", "epochs": 16}]  # ltm.epochs=16 under the default 8
    assert pick_control(rows) is rows[1] and pick_control(rows, like=rows[4]) is rows[3]
    assert pick_control(rows, like=rows[2]) is rows[1] and pick_control(rows, like=rows[0]) is rows[1]
    assert pick_control(rows, like=rows[5]) is rows[3]  # trained as long, though under another setting
    df = comparison_table(rows, "det", "mobilevit_xs").set_index("Method")
    assert list(df["ΔBox mAP vs +ft"]) == ["n/a", "0.000", "-0.050", "0.000", "-0.010", "-0.050"]
    lines = below_control_lines("det", list(df.index), rows)
    assert lines[1:-1] == ["- ltm (ratio=0.64): Box mAP -0.050 against the control baseline+ft, "
                           "at -13.5 % backbone GMACs.",
                           "- ltm (ratio=0.64, epochs=16): Box mAP -0.050 against the control baseline+ft "
                           "(fine-tuned 16 epochs), at -13.5 % backbone GMACs."]
    text = render_markdown(rows)
    assert "(the same protocol, learning rate and batch; 8, 16 epoch(s))" in text
    assert "each row against the control trained as many epochs, where there is one" in text
    assert "differs from the control" not in text  # every row trained as long as its control


def test_below_the_control_names_the_maps_the_method_made_smaller():
    """The cause issue 40 measured (LTM level with the control at ratio 1, below it at 0.64): the
    heads read maps resized back from smaller grids; the bullet says which, from the record."""
    rows = [_record("baseline", "baseline", 0.45), _record(CONTROL, CONTROL, 0.65, epochs=8, stage="control"),
            _record("ltm", "ltm (ratio=0.64)", 0.31, epochs=8)]
    rows[2]["resized_maps"] = [{"stride": 16, "size": [14, 14], "nominal": [20, 20]},
                               {"stride": 32, "size": [7, 7], "nominal": [10, 10]}]
    assert below_control_lines("det", ["baseline", CONTROL, "ltm (ratio=0.64)"], rows)[1] == (
        "- ltm (ratio=0.64): Box mAP -0.340 against the control, at -13.5 % backbone GMACs; the heads read its "
        "stride-16 map of 14x14 resized to 20x20 and its stride-32 map of 7x7 resized to 10x10.")
