"""``vitbench.apply``: checkpoints stay compatible; bad requests get clear errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import vitbench
from vitbench.errors import UnknownNameError, UnsupportedError
from vitbench.testing import tiny_vit


def test_reduced_model_keeps_timm_state_dict_keys():
    base = tiny_vit()
    reduced = vitbench.apply(tiny_vit(seed=1), "tome", r=4)
    assert list(reduced.state_dict()) == list(base.state_dict())
    reduced.load_state_dict(base.state_dict())
    with torch.inference_mode():
        x = torch.randn(1, 3, 32, 32)
        assert torch.allclose(vitbench.apply(tiny_vit(), "tome", r=4)(x), reduced(x))


def test_unknown_method_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match=r"unknown method 'nope'; valid methods: .*ppt.*tome"):
        vitbench.apply(tiny_vit(), "nope")


def test_model_outside_every_family_is_rejected():
    with pytest.raises(UnsupportedError, match=r"no model-family adapter recognises Linear; supported families: efficientvit, mobilevit, swin, vit"):
        vitbench.apply(nn.Linear(2, 2), "tome")


def test_applying_twice_is_an_error():
    model = vitbench.apply(tiny_vit(), "tome", r=2)
    with pytest.raises(UnsupportedError, match="already reduced by 'tome'"):
        vitbench.apply(model, "ppt")


def _spec(method: str, params_json: str = "{}"):
    import json

    from vitbench.host.spec import RunSpec
    from vitbench.host.values import values_of
    from vitbench.task import REFERENCES

    values = None if method in REFERENCES or method == "nope" else values_of(method, json.loads(params_json))
    return RunSpec(task="cls", model="tiny", method=method, params_json=params_json, data=None,
                   metrics=("gmacs",), batch_size=1, device="cpu", seed=0, values=values)


def test_check_applies_tries_each_method_on_a_copy_and_skips_the_references():
    from vitbench.engine import reduction_context
    from vitbench.host.apply import check_applies

    model = tiny_vit()
    check_applies([_spec("baseline"), _spec("baseline+ft"), _spec("tome", '{"r": 4}')], model)
    assert reduction_context(model) is None  # the copy was reduced, not the model
    with pytest.raises(UnknownNameError, match="unknown method 'nope'"):
        check_applies([_spec("baseline"), _spec("nope")], model)
