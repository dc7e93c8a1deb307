"""The embedded models' weights ship with the package: a first run with an empty cache trains nothing."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from vitbench.cli.main import main
from vitbench.tasks.cls import DEIT_MODEL, LEGACY_MODEL
from vitbench.tasks.cls import default_model as dm

#: the top-1 (%) each shipped model reaches on the 10,000 test images (89.96 and 81.03 as shipped)
TOP1_RANGE = {DEIT_MODEL: (89.9, 100.0), LEGACY_MODEL: (80.0, 83.0)}
#: the most a shipped entry may weigh (weights and metadata)
MAX_MB = 10.0
EMBEDDED = pytest.mark.parametrize("name", [DEIT_MODEL, LEGACY_MODEL])


def _shipped_meta(name: str) -> dict:
    return json.loads(dm.shipped_paths(dm.train_config(model=name), name)[1].read_text())


@EMBEDDED
def test_the_shipped_weights_are_those_of_the_recipe(name):
    model = dm.embedded(name)
    weights, meta_path = dm.shipped_paths(dm.train_config(model=name), name)
    meta = _shipped_meta(name)
    assert meta["config_hash"] == dm.config_hash(dm.train_config(model=name))  # a change of settings must retrain
    assert meta["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert meta["arch"] == json.loads(json.dumps(model.arch)) and meta["train_images"] == 60000
    assert meta["test_images"] == 10000
    low, high = TOP1_RANGE[name]
    assert low <= meta["test_top1_pct"] < high
    assert (weights.stat().st_size + meta_path.stat().st_size) / 1e6 <= MAX_MB
    assert "/" not in meta["command"]  # names no path of the machine it was trained on


@EMBEDDED
def test_an_empty_cache_loads_the_shipped_weights_and_trains_nothing(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path))

    def no_training(**kwargs):
        raise AssertionError("trained an embedded model")

    monkeypatch.setattr(dm, "train_default_model", no_training)
    model, meta = dm.load_default_model(model=name, verbose=False)
    state = torch.load(dm.shipped_paths(dm.train_config(model=name), name)[0], weights_only=True)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert meta["weights_sha256"] == _shipped_meta(name)["weights_sha256"]
    assert list(tmp_path.iterdir()) == []  # nothing written to the cache


def test_other_settings_still_train(tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(dm, "train_default_model", lambda **kw: calls.append(kw) or ("model", {}))
    assert dm.load_default_model(model=DEIT_MODEL, verbose=False, epochs=5) == ("model", {})
    assert calls and calls[0]["epochs"] == 5 and calls[0]["model"].name == DEIT_MODEL


@EMBEDDED
def test_default_model_command_says_where_the_weights_come_from(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path))
    assert main(["default-model", "--model", name]) == 0
    out = capsys.readouterr().out
    meta = _shipped_meta(name)
    assert out.startswith(f"{name}: shipped with vitbench") and f"{meta['test_top1_pct']:.2f} %" in out
    assert meta["weights_sha256"] in out and f"{dm.embedded(name).tokens} tokens" in out
    assert "recipe:" in out and meta["command"] in out
