"""Method parameters from keywords or ``KEY=VALUE`` strings (vitbench.core.params), on real built-ins."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pytest

from vitbench.errors import ParamError, UnknownNameError, VitbenchError
from vitbench.core.params import make_params, param_names, params_dict
from vitbench_plugins.atc import ATCParams
from vitbench_plugins.ats import ATSParams
from vitbench_plugins.ppt import PPTParams
from vitbench_plugins.tome import ToMeParams
from vitbench_plugins.topk import TopKParams


@dataclass(frozen=True)
class OptionalParams:
    limit: Optional[int] = None  # noqa: UP045 - typing.Optional is what this test is about
    name: str = "x"


@dataclass(frozen=True)
class NewStyleUnionParams:  # PEP 604 unions are types.UnionType, not typing.Union
    limit: int | None = None
    r: int | list[int] | tuple[int, float] = 1


@dataclass(frozen=True)
class RequiredParams:
    needed: int


# -- conversions -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("13", 13),
    (" 13 ", 13),
    (13, 13),
    ("[1,2,3,4,5,6,7,8,9,10,11,12]", list(range(1, 13))),  # one r per block
    ("1,2", [1, 2]),
    ([4, 4], [4, 4]),
    ("(13,-0.5)", (13, -0.5)),  # (r, inflect) schedule
    ("(13, 0)", (13, 0.0)),  # parentheses mean the schedule, not a per-block list
    ((13, -0.5), (13, -0.5)),
    ((13, 1), (13, 1.0)),
])
def test_tome_r_takes_an_int_a_list_or_a_schedule(text, expected) -> None:
    r = make_params("tome", ToMeParams, {"r": text}).r
    assert r == expected and type(r) is type(expected)
    if isinstance(expected, tuple):
        assert [type(v) for v in r] == [int, float]


@pytest.mark.parametrize("text, expected", [
    ("true", True), ("True", True), ("1", True), ("yes", True), ("on", True),
    ("false", False), ("0", False), ("no", False), ("OFF", False), (False, False),
])
def test_bools_from_strings(text, expected) -> None:
    assert make_params("tome", ToMeParams, {"prop_attn": text}).prop_attn is expected


@pytest.mark.parametrize("text, expected", [("0.25", 0.25), ("1e-1", 0.1), (1, 1.0)])
def test_floats_from_strings(text, expected) -> None:
    keep = make_params("topk", TopKParams, {"keep": text}).keep
    assert keep == pytest.approx(expected) and type(keep) is float


@pytest.mark.parametrize("text, expected", [
    ("3,6", (3, 6)), ("[3, 6]", (3, 6)), ("(3,6)", (3, 6)), ("3", (3,)), ([3, 6], (3, 6)), ("[]", ()),
])
def test_int_tuples_from_strings(text, expected) -> None:
    assert make_params("topk", TopKParams, {"layers": text}).layers == expected


def test_strings_and_optionals() -> None:
    assert make_params("ppt", PPTParams, {"score": "entropy"}).score == "entropy"
    assert make_params("opt", OptionalParams, {"limit": "none"}).limit is None
    assert make_params("opt", OptionalParams, {"limit": None}).limit is None
    assert make_params("opt", OptionalParams, {"limit": "5"}).limit == 5
    assert make_params("opt", OptionalParams, {"name": 3}).name == "3"


def test_pep604_unions_convert_like_typing_unions() -> None:
    assert make_params("new", NewStyleUnionParams, {"limit": "5"}).limit == 5
    assert make_params("new", NewStyleUnionParams, {"limit": "None"}).limit is None
    assert make_params("new", NewStyleUnionParams, {"r": "(13,0)"}).r == (13, 0.0)
    assert make_params("new", NewStyleUnionParams, {"r": "[1,2]"}).r == [1, 2]
    with pytest.raises(ParamError, match=r"^new\.limit='five' is not a valid int \| None$"):
        make_params("new", NewStyleUnionParams, {"limit": "five"})


def test_defaults_when_nothing_is_given() -> None:
    assert make_params("tome", ToMeParams, {}) == ToMeParams()
    assert param_names(ToMeParams) == ["r", "prop_attn", "trace_source"]


def test_params_dict_is_json_friendly() -> None:
    params = make_params("topk", TopKParams, {"layers": "(3,6)", "fuse": "yes"})
    assert params_dict(params) == {"keep": 0.7, "layers": [3, 6], "score": "cls-attn", "fuse": True}
    json.dumps(params_dict(make_params("tome", ToMeParams, {"r": "(13,-0.5)"})))


@pytest.mark.parametrize("text", ["13", "[1,2,3,4,5,6,7,8,9,10,11,12]", "(13,0)", "(13,-0.5)"])
def test_tome_r_in_every_form_round_trips_through_the_run_spec(text) -> None:
    """``--param tome.r=...`` -> plan -> the spec's JSON (the run id, the store) -> the params
    ``apply`` builds: equal, so ``(13, 0)`` stays a schedule and never becomes a 2-block list."""
    from vitbench.run.plan import build_plan

    given = make_params("tome", ToMeParams, {"r": text})
    (_, spec) = build_plan(task="cls", model="deit_tiny_patch16_224", methods=["tome"], data=None,
                           overrides={"tome": {"r": text}}, metrics=["gmacs"], batch_size=1, device="cpu", seed=0)
    stored = json.loads(json.dumps(json.loads(spec.params_json)))  # as runs.jsonl holds it
    assert make_params("tome", ToMeParams, stored) == given


def test_every_built_in_method_s_defaults_round_trip() -> None:
    from vitbench.host import get_host

    host = get_host()
    for name in host.names("methods"):
        spec = host.method(name)
        default = make_params(name, spec.params, {})
        assert make_params(name, spec.params, json.loads(json.dumps(params_dict(default)))) == default, name


# -- errors ----------------------------------------------------------------------------------
def test_an_unknown_key_lists_the_valid_keys() -> None:
    with pytest.raises(ParamError, match=r"^unknown parameter tome\.rr; valid parameters of tome: "
                                         r"r, prop_attn, trace_source$"):
        make_params("tome", ToMeParams, {"rr": 3})


@pytest.mark.parametrize("method, params_type, key, value, type_name", [
    ("topk", TopKParams, "keep", "lots", "float"),
    ("topk", TopKParams, "keep", True, "float"),
    ("topk", TopKParams, "layers", "[3,x]", "tuple[int, ...]"),
    ("tome", ToMeParams, "prop_attn", "maybe", "bool"),
    ("tome", ToMeParams, "r", "thirteen", "Union[int, list[int], tuple[int, float]]"),
    ("tome", ToMeParams, "r", "(13,-0.5,2)", "Union[int, list[int], tuple[int, float]]"),
    ("tome", ToMeParams, "r", "(13,0.5", "Union[int, list[int], tuple[int, float]]"),
    ("tome", ToMeParams, "r", "[1,2)", "Union[int, list[int], tuple[int, float]]"),
    ("topk", TopKParams, "layers", "3,6]", "tuple[int, ...]"),
    ("ppt", PPTParams, "r", "1.5", "int"),
])
def test_a_wrong_type_names_method_key_and_value(method, params_type, key, value, type_name) -> None:
    with pytest.raises(ParamError) as caught:
        make_params(method, params_type, {key: value})
    assert str(caught.value) == f"{method}.{key}={value!r} is not a valid {type_name}"


def test_a_wrong_item_type_names_the_item() -> None:
    with pytest.raises(ParamError, match=r"^topk\.layers=3\.5 is not a valid int$"):
        make_params("topk", TopKParams, {"layers": "3,3.5"})


@pytest.mark.parametrize("method, params_type, overrides, message", [
    ("tome", ToMeParams, {"r": -3}, r"tome\.r=-3 is out of range; r must be an integer >= 0"),
    ("tome", ToMeParams, {"r": "-3"}, r"tome\.r=-3 is out of range"),
    ("tome", ToMeParams, {"r": "[4,-1]"}, r"tome\.r=\[4, -1\] is out of range"),
    ("topk", TopKParams, {"keep": 1.5}, r"topk\.keep=1\.5 is out of range; it must be in \(0, 1\]"),
    ("topk", TopKParams, {"keep": "0"}, r"topk\.keep=0\.0 is out of range"),
    ("topk", TopKParams, {"layers": "[-1]"}, r"topk\.layers=\[-1\] is out of range; every item must be >= 0"),
    ("ppt", PPTParams, {"threshold": -1}, r"ppt\.threshold=-1\.0 is out of range; it must be >= 0"),
    ("ppt", PPTParams, {"r": "-2"}, r"ppt\.r=-2 is out of range; it must be >= 0"),
    ("atc", ATCParams, {"linkage": "ward"}, r"atc\.linkage='ward'; valid values: average, complete, single$"),
    ("ats", ATSParams, {"keep": 9}, r"ats\.keep=9\.0 is out of range; it must be in \(0, 8\] \(sample points"),
])
def test_range_errors_name_the_method_key_value_and_what_is_valid(method, params_type, overrides, message) -> None:
    with pytest.raises(ParamError, match=message):
        make_params(method, params_type, overrides)


def test_an_unknown_scorer_lists_the_valid_scorers() -> None:
    with pytest.raises(ParamError, match=r"^ppt.score='nope': unknown scorer 'nope'; valid scorers: .*average, cls-attn, entropy") as caught:
        make_params("ppt", PPTParams, {"score": "nope"})
    assert isinstance(caught.value, VitbenchError)


def test_a_dataclass_that_cannot_be_built_is_a_param_error() -> None:
    with pytest.raises(ParamError, match=r"^req: .*needed"):
        make_params("req", RequiredParams, {})


@pytest.mark.parametrize("method, params_type, key, value, shown", [
    ("ppt", PPTParams, "threshold", "nan", "ppt.threshold='nan'"),
    ("ppt", PPTParams, "threshold", "inf", "ppt.threshold='inf'"),
    ("ppt", PPTParams, "threshold", "1e999", "ppt.threshold='1e999'"),
    ("ppt", PPTParams, "threshold", float("-inf"), "ppt.threshold=-inf"),
    ("tome", ToMeParams, "r", "(13,nan)", "tome.r='(13,nan)': nan"),
    ("tome", ToMeParams, "r", "(13, NaN)", "tome.r='(13, NaN)': nan"),
    ("tome", ToMeParams, "r", "(13,-Infinity)", "tome.r='(13,-Infinity)': -inf"),
    ("tome", ToMeParams, "r", (13, float("nan")), "tome.r=(13, nan): nan"),
])
def test_nan_and_inf_are_refused_in_floats_and_tuples(method, params_type, key, value, shown) -> None:
    with pytest.raises(ParamError) as caught:
        make_params(method, params_type, {key: value})
    assert str(caught.value).startswith(shown)
    assert str(caught.value).endswith("is not a finite number; nan and inf are not valid values")
