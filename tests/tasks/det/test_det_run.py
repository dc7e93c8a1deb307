"""One det/seg run spec: the baseline detector trained once and cached (atomically), the backbone
loader, and run_dense_spec's record on the tiny generated set."""
from __future__ import annotations

import dataclasses
import io
import json
import sys
import threading
import time

import pytest
import torch

from vitbench.catalog import MethodSpec, Reduction
from vitbench.engine import Reducer
from vitbench.errors import TokenRuleError, UnknownNameError
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host
from vitbench.run.plan import build_plan
from vitbench.tasks.dense import run as det_run
from vitbench.tasks.dense.run import DenseWorkspace, load_backbone, run_dense_spec, trained_weights
from vitbench.run.execute import reduced_copy
from vitbench.task import REFERENCES


class _FakeTraining:
    """Stands in for the default training: counts calls and changes one weight, so the weights
    returned and saved are visibly the trained ones."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ws, detector, seed):
        self.calls += 1
        with torch.no_grad():
            detector.bbox_head.cls_convs[0][0].conv.weight.fill_(0.5)
        return {"epochs": ws.epochs, "iters": 2, "images": 4, "batch_size": 8, "lr": 0.002, "seconds": 0.0}


@pytest.fixture()
def fake_training(monkeypatch):
    fake = _FakeTraining()
    monkeypatch.setattr(det_run, "train_detector_weights", fake)
    return fake


def _workspace(backbone_factory, det_data, cache_dir, **kwargs) -> DenseWorkspace:
    fields = dict(task="det", model=backbone_factory("mobilevit_xs"), model_name="mobilevit_xs", data=det_data,
                  width="light", epochs=1, cache_dir=cache_dir)
    fields.update(kwargs)
    return DenseWorkspace(**fields)


def test_trained_weights_are_cached_and_reloaded(backbone_factory, det_data, tmp_path, fake_training):
    cache = tmp_path / "cache" / "detectors"
    said: list[str] = []
    ws = _workspace(backbone_factory, det_data, cache)
    weights = trained_weights(ws, 0, said.append)
    assert fake_training.calls == 1
    key = "bbox_head.cls_convs.0.0.conv.weight"
    assert (weights[key] == 0.5).all() and all(v.device.type == "cpu" for v in weights.values())
    path = cache / f"det-mobilevit_xs-{ws.weights_key(0)}.pth"
    # no .tmp; the lock file that training held stays (deleting a lock file races with its next user)
    assert sorted(p.name for p in cache.iterdir()) == [path.with_suffix(".json").name, path.name, path.name + ".lock"]
    assert json.loads(path.with_suffix(".json").read_text())["iters"] == 2
    assert ws.training_info["images"] == 4
    assert any("training the det detector" in s for s in said)
    assert trained_weights(ws, 0, said.append) is weights  # kept in the workspace

    again = _workspace(backbone_factory, det_data, cache)
    said.clear()
    loaded = trained_weights(again, 0, said.append)
    assert fake_training.calls == 1  # from the cache file, not trained again
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[k], weights[k]) for k in weights)
    assert again.training_info == ws.training_info
    assert said == [f"loading the trained det detector {path}"]


def test_every_seed_has_its_own_detector(backbone_factory, det_data, tmp_path, fake_training):
    """--seeds 0,1: seed 1's runs get seed 1's detector, not the one seed 0 trained first (a bug:
    the workspace once kept one set of weights whatever the seed)."""
    ws = _workspace(backbone_factory, det_data, tmp_path)
    first = trained_weights(ws, 0, lambda s: None)
    second = trained_weights(ws, 1, lambda s: None)
    assert fake_training.calls == 2 and second is not first
    assert trained_weights(ws, 0, lambda s: None) is first and trained_weights(ws, 1, lambda s: None) is second
    assert sorted(ws.training_infos) == [0, 1]
    assert {p.name for p in tmp_path.glob("*.pth")} == {f"det-mobilevit_xs-{ws.weights_key(s)}.pth" for s in (0, 1)}


def test_cache_without_its_json_still_loads(backbone_factory, det_data, tmp_path, fake_training):
    ws = _workspace(backbone_factory, det_data, tmp_path)
    trained_weights(ws, 0, lambda s: None)
    path = tmp_path / f"det-mobilevit_xs-{ws.weights_key(0)}.pth"
    path.with_suffix(".json").unlink()
    again = _workspace(backbone_factory, det_data, tmp_path)
    trained_weights(again, 0, lambda s: None)
    assert fake_training.calls == 1 and again.training_info == {"cached": str(path)}


def test_other_settings_train_again(backbone_factory, det_data, tmp_path, fake_training):
    trained_weights(_workspace(backbone_factory, det_data, tmp_path), 0, lambda s: None)
    trained_weights(_workspace(backbone_factory, det_data, tmp_path, epochs=2), 0, lambda s: None)
    trained_weights(_workspace(backbone_factory, det_data, tmp_path), 1, lambda s: None)  # another seed
    assert fake_training.calls == 3 and len(list(tmp_path.glob("*.pth"))) == 3


def test_weights_key_depends_on_what_the_training_depends_on(backbone_factory, det_data, tmp_path):
    base = _workspace(backbone_factory, det_data, tmp_path)
    key = base.weights_key(0)
    assert key == _workspace(backbone_factory, det_data, tmp_path / "elsewhere").weights_key(0)
    assert len(key) == 12
    others = [
        base.weights_key(1),
        dataclasses.replace(base, task="seg").weights_key(0),
        dataclasses.replace(base, width="full").weights_key(0),
        dataclasses.replace(base, epochs=3).weights_key(0),
        dataclasses.replace(base, train_limit=2).weights_key(0),
        dataclasses.replace(base, data=dataclasses.replace(det_data, input_size=96)).weights_key(0),
        dataclasses.replace(base, model=backbone_factory("mobilevit_xs", seed=1)).weights_key(0),  # a checkpoint
    ]
    assert key not in others and len(set(others)) == len(others)


def test_no_cache_dir_trains_without_writing(backbone_factory, det_data, tmp_path, fake_training, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ws = _workspace(backbone_factory, det_data, None)
    trained_weights(ws, 0, lambda s: None)
    assert fake_training.calls == 1 and list(tmp_path.iterdir()) == []


class _FailingSave:
    """torch.save that writes part of the file, then fails (a full disk, an interrupt)."""

    def __call__(self, obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"partial")
        raise OSError("No space left on device")


def test_a_failed_save_leaves_no_cache_file(backbone_factory, det_data, tmp_path, fake_training, monkeypatch):
    monkeypatch.setattr(det_run.torch, "save", _FailingSave())
    ws = _workspace(backbone_factory, det_data, tmp_path)
    with pytest.raises(OSError, match="No space left"):
        trained_weights(ws, 0, lambda s: None)
    assert not list(tmp_path.glob("*.pth")) and not list(tmp_path.glob("*.json"))  # never half a cache file


def test_a_failed_save_leaves_no_temporary_file(backbone_factory, det_data, tmp_path, fake_training, monkeypatch):
    monkeypatch.setattr(det_run.torch, "save", _FailingSave())
    with pytest.raises(OSError):
        trained_weights(_workspace(backbone_factory, det_data, tmp_path), 0, lambda s: None)
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == []  # the training's lock file stays


def test_load_backbone_hybrid():
    model = load_backbone("mobilevit_xs", 3, 320)
    assert model.num_classes == 3 and model.vitbench_input_size == (320, 320) and not model.training


def test_load_backbone_plain_vit_is_built_for_the_input_size():
    model = load_backbone("deit_tiny_patch16_224", 5, 96)
    assert tuple(model.patch_embed.img_size) == (96, 96) and model.patch_embed.grid_size == (6, 6)
    assert model.num_classes == 5 and model.vitbench_input_size == (96, 96)


def test_load_backbone_unknown_name():
    with pytest.raises(UnknownNameError, match="unknown model 'mobilevit_xss'.*mobilevit_xs"):
        load_backbone("mobilevit_xss", 3, 320)


def test_run_dense_spec_records(backbone_factory, det_data, tmp_path):
    """baseline, tome and ltm (fine-tuned) specs through run_dense_spec with the real (1-epoch) training."""
    plan = build_plan(task="det", model="mobilevit_xs", methods=["tome", "ltm"], data=str(det_data.root),
                      overrides={"tome": {"r": 2}, "ltm": {"ratio": 0.5, "stats_images": 4, "ib_weight": 0.0}},
                      metrics=("accuracy", "gmacs", "params", "throughput", "latency", "memory"), batch_size=2,
                      device="cpu", seed=0, train_limit=4)
    ws = _workspace(backbone_factory, det_data, tmp_path / "cache", work_dir=tmp_path / "work", gmacs_images=2,
                    throughput_repeats=1, latency_repeats=1, verbose_training=False)
    said: list[str] = []
    assert [s.method for s in plan] == ["baseline", "baseline+ft", "tome", "ltm"]
    base, control, tome, ltm = (run_dense_spec(spec, ws, _reduced(ws, spec), said.append) for spec in plan)
    assert any("training the det detector" in s for s in said)
    assert any("fine-tuning the baseline detector without a method" in s for s in said)
    for record in (base, control, tome, ltm):
        assert record["detector"] == "SSDLite (SSDNeck + depthwise SSDHead), light heads, 64x64"
        assert record["detector_training"]["epochs"] == 1 and record["detector_training"]["images"] == 4
        assert all(0.0 <= record[k] <= 1.0 for k in ("box_map", "box_ap50", "box_ap75"))
        assert "mask_map" not in record and record["num_images"] == 4
        assert record["gmacs_images"] == 2 and record["gmacs_input"] == "64x64"
        assert 0 < record["backbone_gmacs"] < record["gmacs"]
        assert 0 < record["backbone_params_m"] < record["params_m"]
        assert record["throughput_img_s"] > 0 and record["latency_ms"] > 0 and "peak_mem_mb" in record
    assert tome["gmacs"] < base["gmacs"] and ltm["gmacs"] < base["gmacs"]
    assert tome["params_m"] == base["params_m"] < ltm["params_m"]  # LTM's own parameters
    assert "trained" not in base and "trained" not in tome
    assert ltm["trained"] == "fine-tuned" and ltm["train_stages"][0]["images"] == 4
    assert ltm["dense_finetune"]["protocol"] == "all"  # the default: the whole detector fine-tunes
    # LTM merged the stride-16 map from 4x4 to 3x3; the heads read it resized back (the report says so)
    assert ltm["resized_maps"] == [{"stride": 16, "size": [3, 3], "nominal": [4, 4]}]
    assert not any("resized_maps" in r for r in (base, control, tome))
    assert list((tmp_path / "cache").glob("det-mobilevit_xs-*.pth"))
    # the control: the unreduced detector, fine-tuned as ltm's detector was (every detector weight,
    # as many epochs and iterations), no method parameters
    assert control["gmacs"] == base["gmacs"] and control["params_m"] == base["params_m"]
    assert control["trained"] == "fine-tuned" and control["dense_finetune"] == ltm["dense_finetune"]
    (stage,) = control["train_stages"]
    assert stage["name"] == "control" and stage["epochs"] == ltm["train_stages"][0]["epochs"] == 8
    assert stage["iters"] == ltm["train_stages"][0]["iters"] and stage["images"] == 4
    assert control["trainable_params"] == round(base["params_m"] * 1e6)  # every detector weight


def test_load_backbone_random_init_is_seeded():
    from vitbench.tasks.dense.run import load_backbone

    a, b = (load_backbone("mobilevit_xs", 3, 64, seed=0) for _ in range(2))
    c = load_backbone("mobilevit_xs", 3, 64, seed=1)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert any(not torch.equal(a.state_dict()[k], c.state_dict()[k]) for k in a.state_dict()
               if a.state_dict()[k].is_floating_point())


class _Said(io.StringIO):
    """stderr that notes when a caller says it waits for the detector cache's lock."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def write(self, text: str) -> int:
        if "waiting for another vitbench process" in text:
            self.waiting.set()
        return super().write(text)


def test_a_second_caller_waits_for_the_detector_training_and_loads_it(backbone_factory, det_data, tmp_path,
                                                                       monkeypatch):
    """Two callers at once (threads here, processes alike: a lock file beside the cache file):
    the detector is trained once; the other caller waits, saying so once, then loads the file."""
    said = _Said()
    monkeypatch.setattr(sys, "stderr", said)
    calls: list[int] = []
    fake = _FakeTraining()

    def slow_training(ws, detector, seed):  # type: ignore[no-untyped-def]
        calls.append(seed)
        assert said.waiting.wait(timeout=60)  # the other caller waits for the lock meanwhile
        time.sleep(0.2)
        return fake(ws, detector, seed)

    monkeypatch.setattr(det_run, "train_detector_weights", slow_training)
    cache = tmp_path / "cache"
    workspaces = [_workspace(backbone_factory, det_data, cache) for _ in range(2)]
    start = threading.Barrier(2)
    got: list = [None, None]
    notes: list[list[str]] = [[], []]

    def ask(i: int) -> None:
        start.wait()
        got[i] = trained_weights(workspaces[i], 0, notes[i].append)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert calls == [0] and got[0] is not None and got[1] is not None
    key = "bbox_head.cls_convs.0.0.conv.weight"
    assert (got[0][key] == 0.5).all() and torch.equal(got[0][key], got[1][key])
    path = cache / f"det-mobilevit_xs-{workspaces[0].weights_key(0)}.pth"
    assert sorted(n[-1] for n in notes) == ["detector trained in 0 s (2 iterations)",
                                            f"loading the trained det detector {path}"]
    assert said.getvalue() == (f"vitbench: waiting for another vitbench process training the det detector "
                               f"(lock {path}.lock)\n")


@dataclasses.dataclass(frozen=True)
class _NoParams:
    pass


class _DropsTheClassToken(Reducer):
    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        return x[:, 1:]


class _BrokenMethod:
    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        register(MethodSpec(name="drops-cls", params=_NoParams, build=lambda p, info: Reduction(
            [_DropsTheClassToken() if i == 1 else None for i in range(info.depth)])))


def _run_on_deit_tiny(method: str, metrics: tuple[str, ...], backbone_factory, det_data, tmp_path) -> None:
    """One det run of ``method`` on a 3-block DeiT-Tiny backbone (the baseline not run)."""
    backbone = backbone_factory("deit_tiny_patch16_224", depth=3)
    ws = _workspace(backbone_factory, det_data, tmp_path, model=backbone, model_name="deit_tiny_patch16_224")
    (spec,) = [s for s in build_plan(task="det", model="deit_tiny_patch16_224", methods=[method],
                                     data=str(det_data.root), metrics=metrics, device="cpu", seed=0,
                                     overrides={}, batch_size=2)
               if s.method == method]
    run_dense_spec(spec, ws, _reduced(ws, spec), lambda s: None)


def test_a_backbone_method_that_breaks_a_token_rule_fails_before_measuring(backbone_factory, det_data, tmp_path,
                                                                             fake_training):
    get_host().add_plugin(_BrokenMethod(), "broken_det_method")
    with pytest.raises(TokenRuleError, match=r"^token rule broken by drops-cls at block 1: it drops or reorders "
                                             r"the prefix tokens \(image 0: cls dropped or changed\)"):
        _run_on_deit_tiny("drops-cls", ("gmacs",), backbone_factory, det_data, tmp_path)


class _DropsTheClassTokenAfterTheCheck(Reducer):
    """Keeps the rules on its first call (the 4-image check before measuring, which restores the
    reducer's own attributes afterwards: the count lives outside it), breaks them later."""

    calls: list[int] = []

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        self.calls.append(x.shape[0])
        return x if len(self.calls) == 1 else x[:, 1:]


class _LateBrokenMethod:
    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        register(MethodSpec(name="drops-cls-later", params=_NoParams, build=lambda p, info: Reduction(
            [_DropsTheClassTokenAfterTheCheck() if i == 1 else None for i in range(info.depth)])))


def test_a_rule_broken_only_while_the_map_is_scored_is_caught_there(backbone_factory, det_data, tmp_path,
                                                                     fake_training):
    get_host().add_plugin(_LateBrokenMethod(), "late_broken_det_method")
    with pytest.raises(TokenRuleError, match=r"^token rule broken by drops-cls-later at block 1: it drops or "
                                             r"reorders the prefix tokens"):
        _run_on_deit_tiny("drops-cls-later", ("accuracy",), backbone_factory, det_data, tmp_path)


def _reduced(ws, spec):
    """The backbone copy the executor would hand the task: reduced by the spec's method."""
    return reduced_copy(ws, None if spec.method in REFERENCES else spec.method, spec.values)
