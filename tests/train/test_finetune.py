"""The fine-tuning loop (vitbench.train) with a small learnable test method: what trains, what
stays frozen, the callbacks, the alternating optimisers and the checkpoint round trip."""
from __future__ import annotations

import sys


import pytest
import torch
from torch import nn

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import CheckpointError, NonFiniteError
from vitbench.testing import tiny_vit

from tests_support import CALLS, SCALES, STAGES_SEEN  # noqa: E402 - tests/tests_support.py: the learnable test method
from vitbench.tasks.cls.finetune import finetune
from vitbench.train import load_trained, save_trained
from vitbench.train.stages import is_arch_step, trainable_parameters

@pytest.fixture(scope="module")
def fmnist():
    from vitbench.tasks.cls.data import resolve_cls_data

    return resolve_cls_data("fashion-mnist", _model())


def _model() -> nn.Module:
    model = tiny_vit(in_chans=1)
    model.pretrained_cfg = {"input_size": (1, 32, 32), "mean": (0.2190,), "std": (0.3318,),
                            "crop_pct": 1.0, "interpolation": "bilinear"}
    return model


def test_only_the_method_trains_and_the_backbone_stays_frozen(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = finetune(model, fmnist, limit=96)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"blocks.0.reducer.scale", "blocks.0.reducer.alpha", "blocks.0.reducer.epochs_seen"}
    assert result.train_images == 96 and result.stages[0]["iters"] == 3
    assert set(result.stages[0]) >= {"last_loss", "last_ce", "last_extra"}
    assert not model.training
    # callbacks: statistics pass over the 96 images in eval mode, one epoch end, 3 steps, the end
    assert CALLS == [("before", 96, False), ("step",), ("step",), ("step",), ("epoch_end", 0), ("after",)]
    # requires_grad restored
    assert all(p.requires_grad for p in model.parameters())


def test_callbacks_see_the_stage_as_the_task_runs_it(gate_method, fmnist, monkeypatch):
    """``reduction_context(model).stage`` is the stage after the task's ``prepare`` (a dense task
    lengthens it: callbacks that act after the last epoch count its real epochs), and None after."""
    import dataclasses

    from vitbench.tasks.cls.finetune import ClsStages

    monkeypatch.setattr(ClsStages, "prepare", lambda self, stage, last: dataclasses.replace(stage, epochs=2))
    model = vitbench.apply(_model(), gate_method)
    finetune(model, fmnist, limit=32)
    assert [(s.name, s.epochs) for s in STAGES_SEEN] == [("search", 2), ("search", 2)]
    assert reduction_context(model).stage is None


def test_a_moving_average_replaces_the_weights_before_the_stage_ends(gate_method, fmnist):
    """``ema_decay``: ``avg <- d avg + (1 - d) p`` after every step, from the weights before the
    first; the stage's ``after`` callbacks and the caller see the average, not the last step."""
    model = vitbench.apply(_model(), gate_method, ema_decay=0.5)
    start = model.blocks[0].reducer.scale.detach().clone()
    finetune(model, fmnist, limit=96)
    *steps, at_after = SCALES
    assert len(steps) == 3
    expected = start
    for p in steps:
        expected = 0.5 * expected + 0.5 * p
    torch.testing.assert_close(at_after, expected)
    torch.testing.assert_close(model.blocks[0].reducer.scale.detach(), expected)
    assert not torch.allclose(expected, steps[-1])


def test_a_moving_average_decay_outside_0_1_is_refused():
    from vitbench.catalog import TrainStage
    from vitbench.errors import ParamError
    from vitbench.train.stages import check_stage

    with pytest.raises(ParamError, match=r"m: ema_decay 1.0 is out of range \(0, 1\); None: no average"):
        check_stage("m", TrainStage(ema_decay=1.0))
    with pytest.raises(ParamError, match=r"m: min_lr_ratio 2 is out of range \[0, 1\]"):
        check_stage("m", TrainStage(min_lr_ratio=2))


def test_train_backbone_trains_everything(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method)
    head = model.head.weight.clone()
    finetune(model, fmnist, limit=64, train_backbone=True)
    assert not torch.equal(head, model.head.weight)


def test_trainable_filter_and_stages(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method, two_stages=True)
    stages = reduction_context(model).reduction.train
    assert set(trainable_parameters(model, stages[1])) == {"blocks.0.reducer.scale"}
    assert set(trainable_parameters(model, stages[0], train_backbone=True)) == {
        n for n, _ in model.named_parameters()}
    result = finetune(model, fmnist, limit=32)
    assert [s["name"] for s in result.stages] == ["search", "retrain"]


def test_alternating_steps_update_one_group_at_a_time(gate_method, fmnist):
    assert [is_arch_step(i, 0.3) for i in range(10)].count(True) == 3
    assert not any(is_arch_step(i, 0.0) for i in range(10))
    model = vitbench.apply(_model(), gate_method, arch_fraction=0.5)
    gate = model.blocks[0].reducer
    finetune(model, fmnist, limit=64)  # 2 steps: weights then arch
    assert not torch.equal(gate.scale, torch.ones_like(gate.scale))
    assert gate.alpha.item() != 0.0


def test_zero_epochs_trains_nothing_but_runs_the_statistics(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method, epochs=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    finetune(model, fmnist, limit=32)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert [c[0] for c in CALLS] == ["before", "after"]


def test_checkpoint_round_trip_and_corrupt_file(gate_method, fmnist, tmp_path):
    model = vitbench.apply(_model(), gate_method)
    finetune(model, fmnist, limit=32)
    path = save_trained(model, tmp_path / "ckpt" / "m.pth")
    fresh = load_trained(vitbench.apply(_model(), gate_method), path)
    x = torch.randn(2, 1, 32, 32)
    assert torch.allclose(fresh.eval()(x), model.eval()(x))
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="m.pth"):
        load_trained(vitbench.apply(_model(), gate_method), path)
    with pytest.raises(CheckpointError, match="does not fit"):
        save_trained(model, path)
        load_trained(vitbench.apply(_model(), "tome"), path)


def test_a_non_finite_loss_stops_training_naming_the_term_and_where(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method, nan_extra_at=2)
    with pytest.raises(NonFiniteError) as err:
        finetune(model, fmnist, limit=96)  # 3 steps of 32: the second one's extra loss is NaN
    assert str(err.value) == ("test-gate: the loss became non-finite (extra = nan) "
                              "in stage 'search', epoch 1, iteration 2")
    assert CALLS == [("before", 96, False), ("step",)]  # stopped there: no more steps, no callbacks
    assert all(p.requires_grad for p in model.parameters())  # restored even so


def test_a_non_finite_gradient_stops_training_before_the_update(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method)
    gate = model.blocks[0].reducer
    gate.scale.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    with pytest.raises(NonFiniteError, match=r"^test-gate: the gradient of blocks\.0\.reducer\.scale became "
                                             r"non-finite \(48 of 48 values\) in stage 'search', "
                                             r"epoch 1, iteration 1$"):
        finetune(model, fmnist, limit=32)
    assert torch.equal(gate.scale, torch.ones_like(gate.scale))  # the step never ran


def test_non_finite_weights_after_training_are_an_error(gate_method, fmnist):
    model = vitbench.apply(_model(), gate_method, nan_buffer=True)  # epoch_end writes a NaN buffer
    with pytest.raises(NonFiniteError, match=r"^test-gate: the fine-tuned weights hold non-finite values "
                                             r"\(blocks\.0\.reducer\.epochs_seen: 1 of 1\) after stage 'search'$"):
        finetune(model, fmnist, limit=32)


def test_the_detector_training_hook_names_the_loss_term():
    from types import SimpleNamespace

    from vitbench.train.stages import FiniteLossHook

    hook = FiniteLossHook("detector training", "default training")
    runner = SimpleNamespace(epoch=1)
    hook.after_train_iter(runner, 3, outputs={"loss": torch.tensor(1.0), "loss_cls": torch.tensor(0.5)})
    with pytest.raises(NonFiniteError, match=r"^detector training: the loss became non-finite \(loss_cls = inf\) "
                                             r"in stage 'default training', epoch 2, iteration 4$"):
        hook.after_train_iter(runner, 3, outputs={"loss": torch.tensor(float("inf")),
                                                  "loss_cls": torch.tensor(float("inf")), "acc": 0.5})


def test_the_loop_helpers_moved_to_stages_still_import_from_finetune():
    """Code written before the one stage loop imports them from vitbench.train.finetune: it keeps
    working, with a deprecation warning naming the new home."""
    from vitbench.train import stages

    with pytest.warns(DeprecationWarning, match=r"vitbench.train.finetune.StageHook moved to vitbench.train.stages"):
        from vitbench.train.finetune import StageHook
    assert StageHook is stages.StageHook
    with pytest.raises(ImportError):
        from vitbench.train.finetune import no_such_name  # noqa: F401


def test_the_cls_trainer_moved_under_its_task_and_still_imports_from_train(monkeypatch):
    """``vitbench.train.finetune`` (the function and the module) moved to vitbench.tasks.cls.finetune:
    the old names still give it, with a deprecation warning naming the new home."""
    import vitbench.train
    from vitbench.tasks.cls import finetune as new

    # an earlier import of the old module name binds it on the package; start from a fresh import
    monkeypatch.delattr(vitbench.train, "finetune", raising=False)
    monkeypatch.delitem(sys.modules, "vitbench.train.finetune", raising=False)
    with pytest.warns(DeprecationWarning, match=r"vitbench.train.finetune moved to vitbench.tasks.cls.finetune"):
        from vitbench.train import finetune as old_function
    assert old_function is new.finetune
    with pytest.warns(DeprecationWarning, match=r"moved to vitbench.tasks.cls.finetune"):
        import vitbench.train.finetune as old_module  # noqa: F401
    assert old_module.ClsStages is new.ClsStages
