"""A method's parameters are parsed once (:mod:`vitbench.host.values`): the dataclass the run
starts with is the one the plan's spec carries and the one :func:`vitbench.apply` receives."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vitbench
from vitbench.errors import ParamError, VitbenchError
from vitbench.host import get_host
from vitbench.host.values import method_values, values_of

ROOT = Path(__file__).resolve().parents[1]
#: what builds a parameter dataclass from values: its callers outside core/params.py and testing/ are counted
BUILDERS = {"make_params", "params_from_json"}


def _builder_sites() -> list[str]:
    sites = []
    for path in sorted([*(ROOT / "vitbench").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("vitbench/core/params.py",) or rel.startswith("vitbench/testing/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in BUILDERS:
                    sites.append(f"{rel}:{node.lineno}")
    return sites


def test_parameter_dataclasses_are_built_in_one_place() -> None:
    sites = _builder_sites()
    assert [s.partition(":")[0] for s in sites] == ["vitbench/host/values.py"], sites


def test_a_run_parses_each_methods_parameters_once(tmp_path, monkeypatch) -> None:
    import vitbench.host.apply as apply_module
    import vitbench.host.values as values_module

    parsed, applied = [], []
    real_make, real_apply = values_module.make_params, apply_module.apply
    monkeypatch.setattr(values_module, "make_params", lambda *a: parsed.append(a[0]) or real_make(*a))

    def spying_apply(model, method, params=None, /, **overrides):
        applied.append((method, params, overrides))
        return real_apply(model, method, params, **overrides)

    monkeypatch.setattr("vitbench.run.execute.apply", spying_apply)
    monkeypatch.setattr(apply_module, "apply", spying_apply)
    r = vitbench.benchmark(model="test_vit", methods=["tome", "topk"], params={"tome": {"r": "8"}},
                           metrics=["gmacs"], out=tmp_path)
    assert r.ok and sorted(parsed) == ["tome", "topk"]
    tome = get_host().method("tome").params(r=8)
    assert ("tome", tome, {}) in applied and all(not kw for _, _, kw in applied)  # the dataclass, never keywords


def test_values_given_as_an_instance_are_taken_as_they_are() -> None:
    tome = get_host().method("tome").params(r=5)
    assert method_values(["tome", "topk"], {"tome": tome})["tome"] is tome
    assert values_of("ibtm", {"ratio": "0.8"}) == get_host().method("ltm").params(ratio=0.8)


@pytest.mark.parametrize("methods, given, said", [
    (["tome"], {"topk": {"k": 1}}, r"--param names method 'topk', which is not in --methods \(tome\)"),
    (["ltm"], {"ltm": {"ratio": "0.8"}, "ibtm": {"ratio": "0.7"}},
     r"--param ltm.ratio is given twice, as '0.8' and '0.7' \(through the alias 'ibtm'\)"),
    (["tome"], {"tome": 8}, r"the parameters of tome are a int; give a dict of values .* or a ToMeParams"),
    (["tome"], {"tome": {"r": "x"}}, r"tome\.r"),
])
def test_bad_values_are_one_line_naming_them(methods, given, said) -> None:
    with pytest.raises(VitbenchError, match=said):
        method_values(methods, given)


def test_a_matched_run_refuses_its_budget_knob() -> None:
    with pytest.raises(ParamError, match=r"--param tome\.r conflicts with matched compute"):
        method_values(["tome"], {"tome": {"r": "8"}}, matched=True)
