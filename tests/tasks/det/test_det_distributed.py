"""det/seg under ``--launcher pytorch|slurm``, one process standing in for a rank (the 2-rank
torchrun run is tests/cli/test_launcher.py's): the baseline detector is loaded or trained by the
first run that needs it, the ranks deciding together (the cache only when every rank has it),
cached under a key with the number of ranks, never while the workspace is built (a --resume with
nothing left trains nothing); CocoMetric gathers the ranks' results in the spec's work folder; the
ranks other than 0 only evaluate (the detector training under a process group: test_det_ddp.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vitbench.host import distributed
from vitbench.catalog import WorkspaceRequest
from vitbench.cli.main import build_parser
from vitbench.cli.run_cmd import run_options
from vitbench.errors import VitbenchError
from vitbench.run.plan import build_plan
from vitbench.host import get_host
from vitbench.tasks.dense import run as det_run
from vitbench.tasks.dense.evaluate import coco_metric
from vitbench.tasks.dense.run import DenseWorkspace, run_dense_spec, trained_weights
from vitbench.run.execute import reduced_copy
from vitbench.task import REFERENCES


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


def test_the_ranks_decide_together_whether_to_load_the_cached_detector(backbone_factory, det_data, tmp_path,
                                                                        monkeypatch):
    """Under a launcher the cache is loaded only when every rank finds it (``all_ranks``, a
    collective); otherwise every rank trains (with DDP, together) and rank 0 alone writes."""
    calls: list[int] = []
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training(calls))
    trained_weights(_workspace(backbone_factory, det_data, tmp_path), 0, lambda s: None)  # cached, seed 0
    assert calls == [0]
    asked: list[bool] = []

    def another_rank_lacks_the_file(flag: bool) -> bool:  # the load decisions (before and under rank 0's
        asked.append(flag)                                 # training lock), then rank 0's write
        return flag and len(asked) > 2

    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "all_ranks", another_rank_lacks_the_file)
    monkeypatch.setattr(distributed, "is_main", lambda: False)  # rank 1: trains, does not write
    (cached,) = tmp_path.glob("det-mobilevit_xs-*.pth")
    stamp = cached.stat().st_mtime_ns
    ws = _workspace(backbone_factory, det_data, tmp_path)
    said: list[str] = []
    assert trained_weights(ws, 0, said.append)
    assert calls == [0, 0] and asked == [True, True, True]  # this rank had the file; the ranks trained together
    assert not any(s.startswith("loading") for s in said)
    assert cached.stat().st_mtime_ns == stamp and len(list(tmp_path.glob("*.pth"))) == 1  # rank 0 writes


def test_every_rank_fails_when_rank_0_cannot_write_the_detector(backbone_factory, det_data, tmp_path, monkeypatch):
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training([]))
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    monkeypatch.setattr(distributed, "all_ranks", lambda flag: False)  # rank 0 failed to write
    with pytest.raises(VitbenchError, match=r"^rank 0 could not write the trained detector to .*\.pth$"):
        trained_weights(_workspace(backbone_factory, det_data, tmp_path), 0, lambda s: None)


def _det_key_fields(ws: DenseWorkspace, seed: int) -> dict:
    """What the cache key hashed before launchers trained detectors (the single-process key)."""
    import mmdet
    import timm

    return {"task": ws.task, "model": ws.model_name, "data": ws.data.name, "width": ws.width,
            "classes": list(ws.data.classes), "epochs": ws.epochs, "limit": ws.train_limit, "batch": 8,
            "seed": seed, "input": ws.data.input_size, "timm": timm.__version__, "mmdet": mmdet.__version__,
            "backbone": det_run._state_digest(ws.model)}


def test_the_cache_key_holds_the_number_of_ranks_only_when_there_are_several(backbone_factory, det_data, tmp_path,
                                                                              monkeypatch):
    import hashlib
    import json

    ws = _workspace(backbone_factory, det_data, tmp_path)
    fields = _det_key_fields(ws, 0)
    single = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    assert ws.weights_key(0) == single  # one process: the key of the caches written so far
    monkeypatch.setattr(det_run, "_world_size", lambda: 1)
    assert ws.weights_key(0) == single
    monkeypatch.setattr(det_run, "_world_size", lambda: 2)
    two = ws.weights_key(0)
    assert two == hashlib.sha1(json.dumps({**fields, "ranks": 2}, sort_keys=True).encode()).hexdigest()[:12]
    monkeypatch.setattr(det_run, "_world_size", lambda: 4)
    assert len({single, two, ws.weights_key(0)}) == 3  # a DDP-trained detector per number of ranks


def test_the_workspace_trains_nothing_and_a_resume_with_nothing_left_trains_nothing(shapes_root, tmp_path,
                                                                                   monkeypatch):
    """Under a launcher too, the detectors are trained by the first run that needs them (every rank
    together), not while the workspace is built: a --resume whose runs are all finished trains none."""
    from vitbench.run.execute import execute_plan
    from vitbench.results import ResultStore

    calls: list[int] = []
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training(calls))
    args = build_parser().parse_args(["run", "--task", "det", "--methods", "tome", "--data", str(shapes_root),
                                      "--detector-epochs", "1", "--launcher", "pytorch", "--resume"])
    plan = [spec for seed in (0, 1) for spec in build_plan(
        task="det", model="mobilevit_xs", methods=["tome"], data=str(shapes_root), overrides={},
        metrics=("accuracy",), batch_size=2, device="cpu", seed=seed)]
    out = tmp_path / "out"
    task, options = get_host().task("det"), run_options(args, "det")
    request = WorkspaceRequest(options=options, setup=task.setup(options), plan=plan, out=out, resume=True,
                               note=lambda s: None)
    ws = task.workspace(request)
    assert calls == [] and not ws._weights
    store = ResultStore(out)
    for spec in plan:  # every run finished before
        store.append({"spec_id": spec.spec_id, "task": "det", "model": spec.model, "data": spec.data,
                      "method": spec.method, "label": spec.label, "params": spec.params, "seed": spec.seed,
                      "status": "ok", "error": None, "box_map": 0.5})
    records = execute_plan(plan, ws, store, resume=True, env={}, progress=lambda *a: None)
    assert [r["box_map"] for r in records] == [0.5] * len(plan)
    assert calls == [] and not ws._weights and not list((out / "checkpoints").glob("*.pth"))


def test_ranks_other_than_0_only_evaluate(backbone_factory, det_data, tmp_path, monkeypatch):
    """Rank 0 counts GMACs and parameters and times the detector; the others take part in the
    (collective) mAP evaluation only."""
    monkeypatch.setattr(det_run, "train_detector_weights", _fake_training([]))
    (spec,) = [s for s in build_plan(task="det", model="mobilevit_xs", methods=["tome"], data=str(det_data.root),
                                     overrides={"tome": {"r": 2}}, metrics=("accuracy", "gmacs", "params", "latency"),
                                     batch_size=2, device="cpu", seed=0) if s.method == "tome"]
    ws = _workspace(backbone_factory, det_data, tmp_path, latency_repeats=1, gmacs_images=2)
    main = run_dense_spec(spec, ws, _reduced(ws, spec), lambda s: None)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    other = run_dense_spec(spec, ws, _reduced(ws, spec), lambda s: None)
    assert {"gmacs", "backbone_gmacs", "params_m", "latency_ms"} <= main.keys()
    assert not {"gmacs", "backbone_gmacs", "params_m", "latency_ms"} & other.keys()
    fields = ("box_map", "box_ap50", "box_ap75", "num_images")
    assert {k: other[k] for k in fields} == {k: main[k] for k in fields}


def _reduced(ws, spec):
    """The backbone copy the executor would hand the task: reduced by the spec's method."""
    return reduced_copy(ws, None if spec.method in REFERENCES else spec.method, spec.values)
