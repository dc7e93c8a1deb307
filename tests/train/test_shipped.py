"""Shipped fine-tuned weights (vitbench.train.shipped): written, found by their settings, loaded
checked; the LTM entry shipped for the default model fits a default ``ibtm`` run."""
from __future__ import annotations

import json

import pytest
import torch

import vitbench
from vitbench.core.params import make_params, params_dict, training_params
from vitbench.errors import CheckpointError
from vitbench.host import get_host
from vitbench.run.plan import build_plan
from vitbench.tasks.cls import DEIT_MODEL, EMBEDDED_TRAIN_LIMIT
from vitbench.testing import tiny_vit
from vitbench.train.shipped import ENV_SHIPPED, SETTINGS, find_shipped, load_shipped, shipped_entries, write_shipped

SETTINGS_OF_RUN = {"model": "tiny", "model_sha256": "abc", "method": "ltm", "params": {"ratio": 0.7},
                   "train_limit": 60, "train_backbone": False, "seed": 0, "precision": "fp32", "data": "d"}


def _trained(seed: int = 0):
    model = vitbench.apply(tiny_vit(0), "ltm")
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".reducer." in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture
def entry_folder(tmp_path, monkeypatch):
    """A package ``shipped_pkg`` whose ``weights`` folder holds one entry of :func:`_trained`."""
    (tmp_path / "shipped_pkg").mkdir()
    (tmp_path / "shipped_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    write_shipped(_trained(), tmp_path / "shipped_pkg" / "weights", "entry", SETTINGS_OF_RUN,
                  {"trained": "trained 1 epoch on 60 images", "command": "vitbench run ..."})
    return tmp_path / "shipped_pkg" / "weights"


def test_an_entry_is_found_by_equal_settings_only_and_loads_the_method_state(entry_folder, monkeypatch):
    entry = find_shipped("shipped_pkg:weights", SETTINGS_OF_RUN)
    assert entry is not None and entry.trained == "trained 1 epoch on 60 images"
    for key, other in [("seed", 1), ("train_limit", 61), ("params", {"ratio": 0.8}), ("model_sha256", "abd")]:
        assert find_shipped("shipped_pkg:weights", {**SETTINGS_OF_RUN, key: other}) is None
    model = vitbench.apply(tiny_vit(0), "ltm")
    load_shipped(model, entry)
    expected = _trained().state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[key], msg=key)  # the method's state; the backbone untouched
    state = torch.load(entry.path, weights_only=True)
    assert state and all(".reducer." in k for k in state)
    monkeypatch.setenv(ENV_SHIPPED, "off")
    assert find_shipped("shipped_pkg:weights", SETTINGS_OF_RUN) is None


def test_a_damaged_or_unfitting_file_is_refused_naming_it(entry_folder):
    entry = find_shipped("shipped_pkg:weights", SETTINGS_OF_RUN)
    other = vitbench.apply(tiny_vit(0), "ltm", ratio=0.5)  # another P: other shapes
    with pytest.raises((CheckpointError, RuntimeError)):
        load_shipped(other, entry)
    state = torch.load(entry.path, weights_only=True)
    state.pop(next(iter(state)))
    torch.save(state, entry.path)
    with pytest.raises(CheckpointError, match=r"entry\.pth have sha256 .* the file is damaged"):
        load_shipped(vitbench.apply(tiny_vit(0), "ltm"), entry)


def test_a_malformed_metadata_file_is_not_an_entry(entry_folder):
    (entry_folder / "notes.json").write_text(json.dumps({"trained": "x"}))
    assert [e.path.name for e in shipped_entries("shipped_pkg:weights")] == ["entry.pth"]
    assert shipped_entries("no_such_package:weights") == [] and shipped_entries("") == []


def test_the_shipped_ltm_entry_fits_a_default_ibtm_run_and_loads():
    """``vitbench run --methods ibtm --task cls`` on the default model (DeiT's layout): its parameters (less the
    inference-only ones) and training images are the shipped entry's, which loads strictly."""
    spec = get_host().method("ibtm")
    entries = [e for e in shipped_entries(spec.weights) if e.settings["model"] == DEIT_MODEL]
    assert len(entries) == 1
    entry = entries[0]
    assert set(entry.settings) == set(SETTINGS)
    defaults = training_params(spec.params, json.loads(json.dumps(params_dict(make_params("ltm", spec.params, {})))))
    assert entry.settings["params"] == defaults
    assert entry.settings["train_limit"] == 60000 and entry.settings["seed"] == 0
    assert entry.trained == "trained 1 epoch on 60,000 images"
    from vitbench.tasks.cls.default_model import load_default_model

    model = vitbench.apply(load_default_model(model=DEIT_MODEL, verbose=False)[0], "ltm")
    load_shipped(model, entry)
    first = model.blocks[0].reducer
    assert first.feature_centroids.shape[0] == 10  # the statistics it was trained against came along
    for name, p in model.named_parameters():
        if ".reducer." not in name:
            assert not torch.isnan(p).any()


def test_the_shipped_ltmp_entry_fits_a_default_ltmp_run_and_loads():
    """``vitbench run --methods ltmp --task cls``: its training parameters and images are the
    shipped entry's, which loads the 24 learned thresholds strictly."""
    spec = get_host().method("ltmp")
    [entry] = [e for e in shipped_entries(spec.weights) if e.settings["model"] == DEIT_MODEL]
    defaults = training_params(spec.params, json.loads(json.dumps(params_dict(make_params("ltmp", spec.params, {})))))
    assert entry.settings["params"] == defaults and entry.settings["train_limit"] == 60000
    from vitbench.tasks.cls.default_model import load_default_model

    model = vitbench.apply(load_default_model(model=DEIT_MODEL, verbose=False)[0], "ltmp")
    untrained = [b.reducer.theta_m.clone() for b in model.blocks]
    load_shipped(model, entry)
    trained = [b.reducer.theta_m for b in model.blocks]
    assert len(trained) == 12 and any(not torch.equal(a, b) for a, b in zip(untrained, trained))


def test_without_train_limit_a_method_with_shipped_weights_trains_on_their_images():
    """Only a run whose parameters are the entry's (the knob aside when matched) takes its
    images; another setting and a sweep keep the default 1,000."""
    from vitbench.core.options import RunOptions
    from vitbench.tasks.cls.task import _shipped_train_limits

    def limits(params=None, **kw):
        options = RunOptions(task="cls", methods=("ibtm", "ltmp", "tome"), params=params or {}, **kw)
        return _shipped_train_limits(options, ["ltm", "ltmp"], DEIT_MODEL)

    both = {"ltm": 60000, "ltmp": 60000}
    assert limits() == both == limits({"ltm": {"ib_step": "always"}})  # inference only
    assert limits({"ibtm": {"ratio": "0.5"}, "ltmp": {"target": "0.6"}}) == {} == limits({"ibtm": {"epochs": "2"}, "ltmp": {"epochs": "2"}})
    # a searched knob is chosen later; LTMP's fraction knob will be F, which the entry (None) is not
    assert limits({"ibtm": {"ratio": "0.5"}}, match_gmacs=0.6) == {"ltm": 60000}
    assert limits(budgets=(0.9, 0.8)) == {}
    limits = _shipped_train_limits(
        RunOptions(task="cls", methods=("ibtm", "ltmp")), ["ltm", "ltmp"], DEIT_MODEL)
    assert limits == both
    plan = build_plan(task="cls", model=DEIT_MODEL, methods=["ibtm", "ltmp"], data="fashion-mnist",
                      overrides={}, metrics=("accuracy",), batch_size=2, device="cpu", seed=0,
                      train_limit=EMBEDDED_TRAIN_LIMIT[DEIT_MODEL], train_limits=limits)
    assert [(s.method, s.train_limit) for s in plan] == [("baseline", None), ("ltm", 60000), ("ltmp", 60000)]
    assert plan[1].label.startswith("ibtm (") and plan[1].shown_as == "ibtm"
    assert plan[1].spec_id == build_plan(task="cls", model=DEIT_MODEL, methods=["ltm"], data="fashion-mnist",
                                         overrides={}, metrics=("accuracy",), batch_size=2, device="cpu", seed=0,
                                         train_limits=limits)[1].spec_id  # an alias names the same run
