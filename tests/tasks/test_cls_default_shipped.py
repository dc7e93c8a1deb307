"""The default model's weights ship with the package: a first run with an empty cache trains nothing."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from vitbench.cli.main import main
from vitbench.tasks.cls import default_model as dm


def _shipped_meta() -> dict:
    return json.loads(dm.shipped_paths(dm.train_config())[1].read_text())


def test_the_shipped_weights_are_those_of_the_default_settings():
    weights, meta_path = dm.shipped_paths(dm.train_config())
    meta = _shipped_meta()
    assert meta["config_hash"] == dm.config_hash(dm.train_config())  # a change of settings must retrain
    assert meta["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert meta["arch"] == json.loads(json.dumps(dm.ARCH)) and meta["train_images"] == 60000
    assert 80.0 < meta["test_top1_pct"] < 83.0


def test_an_empty_cache_loads_the_shipped_weights_and_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path))

    def no_training(**kwargs):
        raise AssertionError("trained the default model")

    monkeypatch.setattr(dm, "train_default_model", no_training)
    model, meta = dm.load_default_model(verbose=False)
    state = torch.load(dm.shipped_paths(dm.train_config())[0], weights_only=True)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert meta["weights_sha256"] == _shipped_meta()["weights_sha256"]
    assert list(tmp_path.iterdir()) == []  # nothing written to the cache


def test_other_settings_still_train(tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(dm, "train_default_model", lambda **kw: calls.append(kw) or ("model", {}))
    assert dm.load_default_model(verbose=False, epochs=2) == ("model", {})
    assert calls and calls[0]["epochs"] == 2


def test_default_model_command_says_where_the_weights_come_from(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path))
    assert main(["default-model"]) == 0
    out = capsys.readouterr().out
    assert "shipped with vitbench" in out and f"{_shipped_meta()['test_top1_pct']:.2f} %" in out
    assert _shipped_meta()["weights_sha256"] in out
