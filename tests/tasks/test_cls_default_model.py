"""The embedded models: config, cache keys, and (slow) training, resuming and the cache round trip."""
from __future__ import annotations

import copy
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
@pytest.mark.parametrize("model", [dm.FMNIST_DEIT, dm.FMNIST_VIT], ids=lambda m: m.name)
def test_normalisation_constants_match_the_data(model: dm.EmbeddedModel) -> None:
    mean, std = dm.fashion_mnist_stats(model)
    assert model.mean[0] == pytest.approx(mean, abs=1e-4)
    assert model.std[0] == pytest.approx(std, abs=1e-4)


@pytest.mark.parametrize(("file", "model"), [("fmnist_deit_default.py", dm.FMNIST_DEIT),
                                             ("fmnist_vit_default.py", dm.FMNIST_VIT)])
def test_config_file_equals_python_config(file: str, model: dm.EmbeddedModel) -> None:
    from mmengine.config import Config

    cfg = Config.fromfile(str(CONFIGS / file)).to_dict()
    cfg.pop("custom_imports")
    assert _plain(cfg) == _plain(dm.train_config(model=model))


def test_the_legacy_settings_keep_their_cache_key() -> None:
    """The first default's shipped weights are found by this key: its config must not change."""
    assert dm.config_hash(dm.train_config(model=dm.FMNIST_VIT)) == "3cba0abd3da9"


@pytest.mark.parametrize(("model", "patches", "side"), [(dm.FMNIST_DEIT, 196, 28), (dm.FMNIST_VIT, 64, 32)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_architecture_has_the_methods_default_blocks(model: dm.EmbeddedModel, patches: int, side: int) -> None:
    from vitbench.data.input_config import input_config

    net = dm.build_arch(model)
    assert len(net.blocks) == 12 and net.patch_embed.num_patches == patches
    assert model.tokens == patches + 1 and net.cls_token is not None
    assert net.pretrained_cfg["mean"] == model.mean
    assert input_config(net).input_size == (side, side) and input_config(net).in_chans == 1


def test_the_default_has_deits_layout() -> None:
    """196 patch tokens and a class token, 12 blocks of 3 heads, MLP ratio 4: DeiT's layout."""
    from vitbench.tasks.cls import DEIT_MODEL

    arch = dm.embedded(DEIT_MODEL).arch
    assert dm.embedded(DEIT_MODEL).tokens == 197
    assert (arch["depth"], arch["num_heads"], arch["mlp_ratio"]) == (12, 3, 4.0)


def test_an_unknown_embedded_model_names_the_valid_ones() -> None:
    with pytest.raises(KeyError, match="vitbench-fmnist-deit"):
        dm.embedded("vitbench-fmnist-nope")


def test_cache_location_and_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dm.ENV_CACHE, str(tmp_path))
    deit = dm.FMNIST_DEIT
    weights, meta = dm.cache_paths(dm.train_config(model=deit), model=deit)
    assert weights.parent == tmp_path and meta.suffix == ".json"
    assert weights.name.startswith("vitbench-fmnist-deit-")
    assert dm.cache_paths(dm.train_config(model=deit, epochs=deit.recipe.epochs + 1), model=deit)[0] != weights
    assert dm.cache_paths(dm.train_config(model=deit, data_dir="/elsewhere"), model=deit)[0] == weights  # no key
    assert dm.checkpoint_dir(dm.train_config(model=deit), model=deit) == tmp_path / "training" / weights.stem
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
    model = dm.build_arch(dm.FMNIST_DEIT).eval()
    ckpt = tmp_path / "w.pth"
    torch.save(model.state_dict(), ckpt)
    cfg = Config.fromfile(str(CONFIGS / "eval_fmnist.py"))
    cfg.model.backbone.model = dict(type="vitbench.TimmVisionTransformer", **dm.FMNIST_DEIT.arch)
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
    assert str(tmp_path) not in on_disk["command"] and "/" not in on_disk["command"]  # no path of this machine
    assert not (tmp_path / "training" / weights.stem).exists()  # the checkpoints go once the model is saved

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

    def fake_training(*, model, cache, verbose, **settings):  # type: ignore[no-untyped-def]
        calls.append(1)
        assert said.waiting.wait(timeout=60)  # the other caller is waiting for the lock meanwhile
        time.sleep(0.2)
        legacy = dm.FMNIST_VIT
        weights, meta_path = dm.cache_paths(dm.train_config(model=legacy, **settings), cache, legacy)
        model = dm.build_arch(legacy).eval()
        torch.save(model.state_dict(), weights)
        meta = {"name": legacy.name, "cache_format": dm.CACHE_FORMAT, "arch": legacy.arch, "trained_by": "fake"}
        meta_path.write_text(json.dumps(meta))
        return model, meta

    monkeypatch.setattr(dm, "train_default_model", fake_training)
    start = threading.Barrier(2)
    got: list = [None, None]

    def ask(i: int) -> None:
        start.wait()
        got[i] = dm.load_default_model(model=dm.FMNIST_VIT, cache=tmp_path, epochs=1, max_train_images=8)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert calls == [1] and all(g is not None and g[1]["trained_by"] == "fake" for g in got)
    a, b = (g[0].state_dict() for g in got)
    assert all(torch.equal(a[k], b[k]) for k in a)
    settings = {"epochs": 1, "max_train_images": 8}
    weights, _ = dm.cache_paths(dm.train_config(model=dm.FMNIST_VIT, **settings), tmp_path, dm.FMNIST_VIT)
    assert said.getvalue().count("waiting for another vitbench process") == 1
    assert f"vitbench: waiting for another vitbench process training vitbench-fmnist-vit (lock {weights}.lock)" \
        in said.getvalue()


class _Stop(Exception):
    """Stands for a training killed between two epochs."""


@pytest.mark.slow
@needs_fmnist
def test_the_default_recipe_trains_and_resumes_after_an_interruption(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """The default's first stage (patch dropout per epoch) trains; a training stopped after its
    first epoch resumes from that epoch's checkpoint, not from zero."""
    import dataclasses

    from vitbench.mm.hooks import PatchDropSchedule

    deit = dataclasses.replace(dm.FMNIST_DEIT, recipe=dm.DEIT_FIRST_STAGE)
    settings = {"epochs": 2, "max_train_images": 256, "max_test_images": 64}
    epochs_begun: list[tuple[int, float]] = []
    schedule = PatchDropSchedule.before_train_epoch

    def noted(self, runner):  # type: ignore[no-untyped-def]
        schedule(self, runner)
        epochs_begun.append((runner.epoch, runner.model.backbone.model.patch_drop.prob))
        if stop and runner.epoch == 1:
            raise _Stop

    monkeypatch.setattr(PatchDropSchedule, "before_train_epoch", noted)
    stop = True
    with pytest.raises(_Stop):
        dm.train_default_model(model=deit, cache=tmp_path, **settings)
    work_dir = dm.checkpoint_dir(dm.train_config(model=deit, **settings), tmp_path, deit)
    assert (work_dir / "last_checkpoint").is_file()
    stop = False
    capsys.readouterr()
    model, meta = dm.train_default_model(model=deit, cache=tmp_path, **settings)
    assert "resuming from its last checkpoint" in capsys.readouterr().err
    assert epochs_begun == [(0, 0.75), (1, 0.75), (1, 0.75)]  # the second run began at the second epoch
    assert not work_dir.exists()
    assert meta["recipe"]["patch_drop"] == list(deit.recipe.patch_drop) and meta["tokens"] == 197
    assert model.patch_drop.prob == 0.75 and not model.training  # evaluation never drops a patch
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


def test_the_earlier_stage_recipes_are_those_of_the_shipped_entries_the_default_continues() -> None:
    """Each earlier stage's recipe hashes to the entry the next stage starts from, whose metadata
    ships (the default's parent with its weights, older ones as metadata only)."""
    import dataclasses

    stems = []
    for recipe in dm.DEIT_EARLIER_STAGES:
        stage = dataclasses.replace(dm.FMNIST_DEIT, recipe=recipe)
        weights, meta = dm.shipped_paths(dm.train_config(model=stage), stage)
        assert meta.is_file() and json.loads(meta.read_text())["recipe"].get("start_from", "") == recipe.start_from
        stems.append(weights.stem)
    assert [r.start_from for r in dm.DEIT_EARLIER_STAGES[1:]] + [dm.FMNIST_DEIT.recipe.start_from] == stems
    assert stems == ["vitbench-fmnist-deit-5977878523d7", "vitbench-fmnist-deit-62ab2bd80658",
                     "vitbench-fmnist-deit-6450bc5f477d", "vitbench-fmnist-deit-045611e9ba74"]
    assert (dm.SHIPPED_DIR / f"{stems[-1]}.pth").is_file()  # the parent's weights: what --retrain starts from


def _method_names() -> list[str]:
    from vitbench.host import PluginHost

    host = PluginHost()
    host.load_entry_points()
    return [n for n in host.names("methods") if host.plugins[host.owner("methods", n)].distribution == "vitbench"]


@pytest.mark.parametrize("method", _method_names())
def test_every_built_in_method_applies_to_the_default_as_to_deit(method: str) -> None:
    """Each built-in method reduces the default's architecture with its default parameters: the
    logits keep their shape and stay finite, and the count never grows."""
    import vitbench
    from vitbench.measure import count_gmacs

    torch.manual_seed(0)
    base = dm.build_arch(dm.FMNIST_DEIT).eval()
    reduced = vitbench.apply(copy.deepcopy(base), method)  # the same weights (downsample resamples pos_embed)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        logits = reduced.eval()(x)
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    assert count_gmacs(reduced, x[:1]).mean <= count_gmacs(base, x[:1]).mean * 1.001


@pytest.mark.skipif(not DEFAULT_DIR.is_dir(), reason="needs the Fashion-MNIST that ships with the machine")
def test_a_recipe_that_continues_shipped_weights_starts_from_them(tmp_path: Path) -> None:
    """``Recipe.start_from``: the first iteration starts from the shipped entry's weights (one step
    at a vanishing learning rate leaves them as they were)."""
    import dataclasses

    shipped = dm.shipped_paths(dm.train_config(model=dm.FMNIST_DEIT), dm.FMNIST_DEIT)[0]
    parent = torch.load(shipped, weights_only=True)
    continued = dataclasses.replace(dm.FMNIST_DEIT, recipe=dm.Recipe(epochs=1, batch_size=8, lr=1e-12,
                                                                     start_from=shipped.stem))
    net, meta = dm.train_default_model(model=continued, max_train_images=16, max_test_images=8,
                                       cache=tmp_path, verbose=False, save=False)
    for key, value in net.state_dict().items():
        assert torch.allclose(value, parent[key], atol=1e-6), key
    assert meta["recipe"]["start_from"] == shipped.stem


def test_weights_to_start_from_are_checked_against_their_sha256() -> None:
    from types import SimpleNamespace

    from vitbench.mm.hooks import StartFromWeights

    start = dm.shipped_paths(dm.train_config(model=dm.FMNIST_DEIT), dm.FMNIST_DEIT)[0].stem
    hook = StartFromWeights(file=f"tasks/cls/weights/{start}.pth", sha256="0" * 64)
    with pytest.raises(ValueError, match=rf"{start}.pth: its sha256 is not 0+; the weights to start from changed"):
        hook.before_train(SimpleNamespace(iter=0, model=None))
    hook.before_train(SimpleNamespace(iter=5, model=None))  # a resumed training keeps its checkpoint
