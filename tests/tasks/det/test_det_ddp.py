"""The pieces of det/seg's DDP fine-tuning that one process can check (the 2-rank torchrun run
is tests/cli/test_launcher.py's): ``DetMethodTrainer.train_step``'s ``forward=`` path (the losses,
the method's extra loss included, computed through the wrapper's forward) and its collective loss
guard, each rank's batch, the stages' statistics passes reading the whole data on every rank
without a collective, the check that every rank holds the same weights, and learnable methods
accepted under a launcher."""
from __future__ import annotations

import copy

import pytest
import torch
from mmengine.optim import OptimWrapper
from torch import nn

import vitbench
from vitbench.host import distributed
from vitbench.cli.main import build_parser
from vitbench.cli.run_cmd import run_options
from vitbench.engine import reduction_context
from vitbench.errors import VitbenchError
from vitbench.host import get_host
from vitbench.tasks.dense.detectors import build_detector
from vitbench.tasks.dense.run import load_detector_weights
from vitbench.tasks.dense.train import DetMethodTrainer, _image_batches, _loader, rank_share

LTM = {"ratio": 0.5, "epochs": 1, "batch_size": 2, "stats_images": 4}  # with its IB loss: an extra loss term


def _ltm_detector(backbone_factory, det_data):  # type: ignore[no-untyped-def]
    """A detector around an LTM-reduced backbone, its statistics pass done (the IB loss needs it)."""
    from vitbench.train.stages import StageHook

    backbone = backbone_factory("mobilevit_xs")
    baseline = build_detector("det", copy.deepcopy(backbone), 3, width="light")
    baseline.init_weights()
    reduced = vitbench.apply(backbone, "ltm", **LTM)
    detector = build_detector("det", reduced, 3, width="light")
    load_detector_weights(detector, baseline.state_dict())
    stage = reduction_context(reduced).reduction.train[0]
    StageHook(stage, reduced, _image_batches(detector, det_data, False, 4, torch.device("cpu"))).before_train(None)
    return detector, stage


def _batch(det_data):  # type: ignore[no-untyped-def]
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    with DefaultScope.overwrite_default_scope("mmdet"):
        loader = Runner.build_dataloader(_loader(det_data.dataset_cfg("train", masks=False, limit=2), 2, False,
                                                 local=True))
    return next(iter(loader))


class _Wrapper(nn.Module):
    """Stands in for MethodDDP: records the forward calls, runs the trainer's forward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls: list[dict] = []

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append({k: v for k, v in kwargs.items() if k != "labels"} | {"labels": "labels" in kwargs})
        return self.module(*args, **kwargs)


def _step(detector, stage, batch, forward=None):  # type: ignore[no-untyped-def]
    trainer = DetMethodTrainer(detector, detector.backbone.model, stage)
    params = [p for n, p in detector.named_parameters() if ".reducer." in n or n.startswith("bbox_head.")]
    for p in detector.parameters():
        p.requires_grad_(any(p is q for q in params))
    trainer.train()
    wrapper = None if forward is None else forward(trainer)
    out = trainer.train_step(batch, OptimWrapper(torch.optim.SGD(params, lr=0.1)), forward=wrapper)
    return out, {k: v.detach().clone() for k, v in detector.state_dict().items()}, wrapper


def test_train_step_computes_every_loss_through_the_forward_it_is_given(backbone_factory, det_data):
    detector, stage = _ltm_detector(backbone_factory, det_data)
    batch = _batch(det_data)
    torch.manual_seed(0)
    plain, plain_state, _ = _step(copy.deepcopy(detector), stage, batch)
    torch.manual_seed(0)
    through, state, wrapper = _step(copy.deepcopy(detector), stage, batch, forward=_Wrapper)
    assert wrapper.calls == [{"mode": "loss", "labels": True}]  # one forward: detection losses and the extra
    assert "extra" in through and {"loss", "loss_cls", "loss_bbox"} <= through.keys()
    assert through.keys() == plain.keys()
    for key in plain:
        torch.testing.assert_close(through[key], plain[key], msg=key)
    for key in plain_state:  # the same update as without a wrapper
        torch.testing.assert_close(state[key], plain_state[key], msg=key)
    assert any(not torch.equal(state[k], v) for k, v in detector.state_dict().items() if ".reducer." in k)


def test_train_step_guards_the_losses_on_every_rank(backbone_factory, det_data, monkeypatch):
    import importlib

    finetune = importlib.import_module("vitbench.train.stages")
    seen: list[tuple] = []
    monkeypatch.setattr(finetune, "check_losses_on_every_rank",
                        lambda losses, who, where: seen.append((sorted(losses), who, where)))
    detector, stage = _ltm_detector(backbone_factory, det_data)
    _step(detector, stage, _batch(det_data))
    ((keys, who, where),) = seen  # the collective guard, once per step (a collective: every rank calls it)
    assert who == "ltm" and "extra" in keys and "loss" in keys and "iteration 1" in where


def test_a_detector_trainer_without_a_method_has_no_extra_loss(backbone_factory, det_data):
    from vitbench.tasks.dense.train import control_stage
    from vitbench.tasks.dense.protocol import dense_finetune_for

    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    trainer = DetMethodTrainer(detector, detector.backbone, control_stage(dense_finetune_for("det", "all")))
    data = trainer.data_preprocessor(_batch(det_data), True)
    out = trainer(data["inputs"], data["data_samples"], mode="loss", labels=torch.zeros(2, dtype=torch.long))
    assert "extra" not in out and {"loss_cls", "loss_bbox"} <= out.keys()


@pytest.mark.parametrize("world, per_rank, effective", [(1, 8, None), (2, 4, 8), (3, 2, 6), (8, 2, 16)])
def test_each_rank_trains_its_share_of_the_batch(monkeypatch, world, per_rank, effective):
    import mmengine.dist

    monkeypatch.setattr(mmengine.dist, "get_world_size", lambda *a: world)
    notes: list[str] = []
    got, record = rank_share(8, "finetune", notes.append)
    assert got == per_rank
    if effective is None:
        assert record == {} and notes == []
    else:
        assert record == {"ranks": world, "rank_batch_size": per_rank, "effective_batch_size": effective}
        assert bool(notes) == (effective != 8)  # told when the effective batch is not the one asked
        if notes:
            assert notes[0] == (f"stage 'finetune': batch 8 over {world} ranks: {per_rank} per rank, "
                                f"an effective batch of {effective}")


def test_statistics_passes_read_the_whole_data_on_every_rank_without_a_collective(backbone_factory, det_data,
                                                                                    monkeypatch):
    """Under a launcher a DefaultSampler would give this rank half the images and agree on a seed
    with the others (a broadcast): neither may happen in the stages' statistics passes."""
    import mmengine.dataset.sampler as sampler

    monkeypatch.setattr(sampler, "get_dist_info", lambda: (1, 2))  # rank 1 of 2

    def no_collective():  # type: ignore[no-untyped-def]
        raise AssertionError("a collective in a statistics pass")

    monkeypatch.setattr(sampler, "sync_random_seed", no_collective)
    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    batches = list(_image_batches(detector, det_data, False, None, torch.device("cpu"))())
    assert sum(len(labels) for _, labels in batches) == 4  # every training image, on this rank too
    assert _loader({}, 2, True)["sampler"]["type"] == "DefaultSampler"  # the training loader still shards


def test_ranks_holding_different_weights_are_named(monkeypatch):
    import mmengine.dist

    module = nn.BatchNorm2d(2)
    distributed.same_on_every_rank(module, "x")  # no process group: nothing to compare
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(mmengine.dist, "all_gather_object", lambda obj: [obj, dict(obj)])
    distributed.same_on_every_rank(module, "x")  # equal on both ranks
    monkeypatch.setattr(mmengine.dist, "all_gather_object", lambda obj: [obj, {**obj, "running_mean": "other"}])
    with pytest.raises(VitbenchError, match=r"^ltm: stage 'finetune': the ranks hold different weights after "
                                            r"training \(1 tensor\(s\) differ from rank 0's, e\.g\. running_mean;"):
        distributed.same_on_every_rank(module, "ltm: stage 'finetune'")


@pytest.mark.parametrize("task, methods", [("det", "tome,ltm"), ("seg", "ltmp,tome,dcs")])
def test_learnable_methods_are_accepted_under_a_launcher(shapes_root, task, methods):
    args = build_parser().parse_args(["run", "--task", task, "--methods", methods, "--data", str(shapes_root),
                                      "--launcher", "pytorch"])
    setup = get_host().task(task).setup(run_options(args, task))
    assert setup.plan["control"] is True  # the baseline+ft control row comes with them


def _initialised(backbone_factory):  # type: ignore[no-untyped-def]
    detector = build_detector("det", backbone_factory("mobilevit_xs"), 3, width="light")
    detector.init_weights()
    return detector.train()


def test_the_default_trainings_step_under_a_launcher_is_mmengines_step_through_the_wrapper(backbone_factory,
                                                                                             det_data):
    """DetectorTrainer (the default training under a launcher) takes the step mmengine's own
    ``train_step`` takes on the detector (what one process trains with), its losses computed
    through the forward it is given (DDP's, so that their backward averages the gradients)."""
    from vitbench.tasks.dense.train import DetectorTrainer

    batch = _batch(det_data)
    detector = _initialised(backbone_factory)
    plain, through = copy.deepcopy(detector), copy.deepcopy(detector)

    def optimiser(model):  # type: ignore[no-untyped-def]
        return OptimWrapper(torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05),
                            clip_grad={"max_norm": 10.0})

    torch.manual_seed(0)
    expected = plain.train_step(copy.deepcopy(batch), optimiser(plain))
    trainer = DetectorTrainer(through)
    wrapper = _Wrapper(trainer)
    torch.manual_seed(0)
    got = trainer.train_step(copy.deepcopy(batch), optimiser(through), forward=wrapper)
    assert wrapper.calls == [{"mode": "loss", "labels": False}] and trainer.steps == 1
    assert got.keys() == expected.keys() and {"loss", "loss_cls", "loss_bbox"} <= got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], msg=key)
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(through.state_dict()[key], value, msg=key)


def test_the_default_training_guards_its_losses_on_every_rank_before_the_update(backbone_factory, det_data,
                                                                                monkeypatch):
    import importlib

    from vitbench.errors import NonFiniteError
    from vitbench.tasks.dense.train import DetectorTrainer

    finetune = importlib.import_module("vitbench.train.stages")
    seen: list[tuple] = []
    check = finetune.check_losses_on_every_rank

    def recorded(losses, who, where):  # type: ignore[no-untyped-def]
        seen.append((sorted(losses), who, where))
        check(losses, who, where)

    monkeypatch.setattr(finetune, "check_losses_on_every_rank", recorded)
    detector = _initialised(backbone_factory)
    loss = detector.loss
    detector.loss = lambda *a, **k: {**loss(*a, **k), "loss_bbox": torch.tensor(float("nan"))}
    before = {k: v.detach().clone() for k, v in detector.named_parameters()}
    trainer = DetectorTrainer(detector)
    trainer.position = (2, 3)
    with pytest.raises(NonFiniteError, match=r"^detector training: the loss became non-finite \(loss_bbox = nan\) "
                                             r"in stage 'default training', epoch 2, iteration 3$"):
        trainer.train_step(_batch(det_data), OptimWrapper(torch.optim.SGD(detector.parameters(), lr=0.1)))
    ((keys, who, _),) = seen  # the collective guard (every rank calls it, every step)
    assert who == "detector training" and "loss" in keys and "loss_bbox" in keys
    assert all(torch.equal(before[k], v) for k, v in detector.named_parameters())  # no weight was updated
