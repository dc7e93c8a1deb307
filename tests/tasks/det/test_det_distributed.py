"""det/seg under ``--launcher pytorch|slurm``, one process standing in for a rank (the 2-rank
torchrun run is tests/cli/test_launcher.py's): the baseline detector of every seed is trained
while the workspace is built, never by every rank at once; CocoMetric gathers the ranks' results
in the spec's work folder; the ranks other than 0 only evaluate (the detector fine-tuning under a
process group: test_det_ddp.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vitbench import distributed
from vitbench.catalog import TaskSetup, WorkspaceRequest
from vitbench.cli.main import build_parser
from vitbench.errors import VitbenchError
from vitbench.plan import build_plan
from vitbench.tasks.det import run as det_run
from vitbench.tasks.det.evaluate import coco_metric
from vitbench.tasks.det.run import DenseWorkspace, run_dense_spec, trained_weights
from vitbench.tasks.det.task import dense_workspace


def _fake_training(calls: list[int]):  # type: ignore[no-untyped-def]
    def train(ws, detector, seed):  # type: ignore[no-untyped-def]
        calls.append(seed)
        return {"epochs": ws.epochs, "iters": 1, "images": 4, "batch_size": 8, "lr": 0.002, "seconds": 0.0}
    return train


@pytest.fixture()
def under_a_launcher(monkeypatch):
    """This process as one rank of several (what the code asks mmengine's process group)."""
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)


def test_coco_metric_collects_in_the_work_folder_under_a_launcher(det_data, tmp_path, under_a_launcher):
    metric = coco_metric(det_data, masks=True, work_dir=tmp_path / "spec")
    assert metric.collect_device == "cpu" and metric.collect_dir == str(tmp_path / "spec" / "collect")
    assert metric.metrics == ["bbox", "segm"]
    assert coco_metric(det_data, masks=False).collect_dir is None  # no shared folder: mmengine's default


def test_coco_metric_without_a_launcher_collects_nowhere(det_data, tmp_path):
    assert coco_metric(det_data, masks=False, work_dir=tmp_path).collect_dir is None


def _workspace(backbone_factory, det_data, cache: Path, **kwargs) -> DenseWorkspace:  # type: ignore[no-untyped-def]
    return DenseWorkspace(task="det", model=backbone_factory("mobilevit_xs"), model_name="mobilevit_xs",
                          data=det_data, width="light", epochs=1, cache_dir=cache, verbose_training=False, **kwargs)


def test_no_rank_trains_the_detector_once_the_ranks_have_started(backbone_factory, det_data, tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training(calls))
    trained_weights(_workspace(backbone_factory, det_data, tmp_path), 0, lambda s: None)  # cached, seed 0
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    ws = _workspace(backbone_factory, det_data, tmp_path)
    assert trained_weights(ws, 0, lambda s: None)  # from the cache: every rank may load it
    with pytest.raises(VitbenchError, match=r"^the det detector of seed 1 was not trained before the ranks "
                                            r"started .* seeds trained: \[0\]$"):
        trained_weights(ws, 1, lambda s: None)
    assert calls == [0]


def test_the_workspace_trains_every_seed_of_the_plan_under_a_launcher(shapes_root, tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training(calls))
    args = build_parser().parse_args(["run", "--task", "det", "--methods", "tome", "--data", str(shapes_root),
                                      "--detector-epochs", "1", "--launcher", "pytorch"])
    plan = [spec for seed in (0, 1) for spec in build_plan(
        task="det", model="mobilevit_xs", methods=["tome"], data=str(shapes_root), overrides={},
        metrics=("accuracy",), batch_size=2, device="cpu", seed=seed)]
    request = WorkspaceRequest(args=args, setup=TaskSetup(model="mobilevit_xs", data=str(shapes_root),
                                                          metrics=("accuracy",)),
                               plan=plan, out=tmp_path / "out", resume=False, note=lambda s: None)
    ws = dense_workspace(request)
    assert calls == [0, 1] and sorted(ws._weights) == [0, 1]  # before any run starts
    assert len(list((tmp_path / "out" / "checkpoints").glob("det-mobilevit_xs-*.pth"))) == 2  # for the other ranks
    args.launcher = "none"
    assert not dense_workspace(request)._weights  # one process: trained when the first run needs it


def test_ranks_other_than_0_only_evaluate(backbone_factory, det_data, tmp_path, monkeypatch):
    """Rank 0 counts GMACs and parameters and times the detector; the others take part in the
    (collective) mAP evaluation only."""
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training([]))
    (spec,) = [s for s in build_plan(task="det", model="mobilevit_xs", methods=["tome"], data=str(det_data.root),
                                     overrides={"tome": {"r": 2}}, metrics=("accuracy", "gmacs", "params", "latency"),
                                     batch_size=2, device="cpu", seed=0) if s.method == "tome"]
    ws = _workspace(backbone_factory, det_data, tmp_path, latency_repeats=1, gmacs_images=2)
    main = run_dense_spec(spec, ws, None, lambda s: None)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    other = run_dense_spec(spec, ws, None, lambda s: None)
    assert {"gmacs", "backbone_gmacs", "params_m", "latency_ms"} <= main.keys()
    assert not {"gmacs", "backbone_gmacs", "params_m", "latency_ms"} & other.keys()
    fields = ("box_map", "box_ap50", "box_ap75", "num_images")
    assert {k: other[k] for k in fields} == {k: main[k] for k in fields}
