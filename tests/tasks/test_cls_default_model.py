"""The embedded default model: config, cache keys, and (slow) training + cache round trip."""
from __future__ import annotations

import io
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from vitbench.data.fashion_mnist import DEFAULT_DIR
from vitbench.tasks.cls import default_model as dm

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "cls"
needs_fmnist = pytest.mark.skipif(not (DEFAULT_DIR / "train-images-idx3-ubyte.gz").is_file(),
                                  reason="dataset-fashion-mnist is not installed")


def _plain(obj):
    """Config -> plain JSON-like data (tuples become lists) for comparison."""
    return json.loads(json.dumps(obj, default=str))


@needs_fmnist
def test_normalisation_constants_match_the_data() -> None:
    mean, std = dm.fashion_mnist_stats()
    assert dm.MEAN[0] == pytest.approx(mean, abs=1e-4)
    assert dm.STD[0] == pytest.approx(std, abs=1e-4)


def test_config_file_equals_python_config() -> None:
    from mmengine.config import Config

    cfg = Config.fromfile(str(CONFIGS / "fmnist_vit_default.py")).to_dict()
    cfg.pop("custom_imports")
    assert _plain(cfg) == _plain(dm.train_config())


def test_architecture_has_the_methods_default_blocks() -> None:
    model = dm.build_arch()
    assert len(model.blocks) == 12 and model.patch_embed.num_patches == 64
    assert model.pretrained_cfg["mean"] == dm.MEAN
    from vitbench.data.input_config import input_config

    assert input_config(model).input_size == (32, 32) and input_config(model).in_chans == 1


def test_cache_location_and_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dm.ENV_CACHE, str(tmp_path))
    weights, meta = dm.cache_paths(dm.train_config())
    assert weights.parent == tmp_path and meta.suffix == ".json"
    assert weights.name.startswith("vitbench-fmnist-vit-")
    assert dm.cache_paths(dm.train_config(epochs=dm.EPOCHS + 1))[0] != weights
    assert dm.cache_paths(dm.train_config(data_dir="/elsewhere"))[0] == weights  # data path is no key
    monkeypatch.delenv(dm.ENV_CACHE)
    assert dm.cache_dir() == Path.home() / ".cache" / "vitbench"


def test_load_default_model_rejects_unknown_settings(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown training arguments"):
        dm.load_default_model(cache=tmp_path, epoch=1)


@needs_fmnist
def test_eval_config_file_matches_evaluate_cls(tmp_path: Path) -> None:
    """configs/cls/eval_fmnist.py through Runner.from_cfg gives evaluate_cls's top-1."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    from vitbench.tasks.cls.evaluate import evaluate_cls, resolve_cls_data

    torch.manual_seed(1)
    model = dm.build_arch().eval()
    ckpt = tmp_path / "w.pth"
    torch.save(model.state_dict(), ckpt)
    cfg = Config.fromfile(str(CONFIGS / "eval_fmnist.py"))
    cfg.model.backbone.model = dict(type="vitbench.TimmVisionTransformer", **dm.ARCH)
    cfg.test_dataloader.dataset.indices = 64
    cfg.work_dir = str(tmp_path / "wd")
    cfg.experiment_name = "vitbench-test-eval-config"
    cfg.load_from = None
    runner = Runner.from_cfg(cfg)
    runner.model.backbone.model.load_state_dict(model.state_dict())
    metrics = runner.test()
    ours = evaluate_cls(model, resolve_cls_data(None, model), limit=64)
    assert metrics["accuracy/top1"] == pytest.approx(ours["top1_pct"])


@pytest.mark.slow
@needs_fmnist
def test_tiny_training_and_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    settings = {"epochs": 1, "max_train_images": 512, "max_test_images": 256, "batch_size": 64}
    model, meta = dm.load_default_model(cache=tmp_path, **settings)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "trained in" in err  # the user sees progress
    weights, meta_path = dm.cache_paths(dm.train_config(**settings), tmp_path)
    assert weights.is_file() and meta_path.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    on_disk = json.loads(meta_path.read_text())
    assert on_disk["test_top1_pct"] == meta["test_top1_pct"] and 0 <= meta["test_top1_pct"] <= 100
    assert on_disk["train_images"] == 512 and on_disk["seed"] == 0 and on_disk["arch"]["depth"] == 12

    def no_training(**kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(dm, "train_default_model", no_training)
    again, meta2 = dm.load_default_model(cache=tmp_path, **settings)
    x = torch.randn(4, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), again(x))
    assert meta2["weights_sha256"] == meta["weights_sha256"]
    monkeypatch.undo()

    # deterministic: training again gives bit-identical weights
    retrained, _ = dm.train_default_model(verbose=False, save=False, **settings)
    with torch.no_grad():
        assert torch.equal(retrained(x), model(x))

    # a corrupt cache entry is reported and retrained, not a crash
    weights.write_bytes(b"corrupt")
    fixed, _ = dm.load_default_model(cache=tmp_path, verbose=False, **settings)
    assert "unusable" in capsys.readouterr().err
    with torch.no_grad():
        assert torch.equal(fixed(x), model(x))


class _Said(io.StringIO):
    """stderr that notes when a process (here: a thread) says it waits for the cache lock."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def write(self, text: str) -> int:
        if "waiting for another vitbench process" in text:
            self.waiting.set()
        return super().write(text)


def test_a_second_caller_waits_for_the_training_and_loads_its_result(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two callers at once (threads here, processes alike: a lock file): the trainer runs once,
    the other waits -- saying so once -- and then loads what the first one cached."""
    said = _Said()
    monkeypatch.setattr(sys, "stderr", said)
    calls: list[int] = []

    def fake_training(*, cache, verbose, **settings):  # type: ignore[no-untyped-def]
        calls.append(1)
        assert said.waiting.wait(timeout=60)  # the other caller is waiting for the lock meanwhile
        time.sleep(0.2)
        weights, meta_path = dm.cache_paths(dm.train_config(**settings), cache)
        model = dm.build_arch().eval()
        torch.save(model.state_dict(), weights)
        meta = {"name": dm.NAME, "cache_format": dm.CACHE_FORMAT, "arch": dm.ARCH, "trained_by": "fake"}
        meta_path.write_text(json.dumps(meta))
        return model, meta

    monkeypatch.setattr(dm, "train_default_model", fake_training)
    start = threading.Barrier(2)
    got: list = [None, None]

    def ask(i: int) -> None:
        start.wait()
        got[i] = dm.load_default_model(cache=tmp_path, epochs=1, max_train_images=8)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert calls == [1] and all(g is not None and g[1]["trained_by"] == "fake" for g in got)
    a, b = (g[0].state_dict() for g in got)
    assert all(torch.equal(a[k], b[k]) for k in a)
    weights, _ = dm.cache_paths(dm.train_config(epochs=1, max_train_images=8), tmp_path)
    assert said.getvalue().count("waiting for another vitbench process") == 1
    assert f"vitbench: waiting for another vitbench process training the default model (lock {weights}.lock)" \
        in said.getvalue()
