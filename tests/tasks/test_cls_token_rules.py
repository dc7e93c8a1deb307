"""A cls run checks the token rules before measuring: a method that breaks one gets an ``error``
record naming the rule (not a row with GMACs); a correct one is measured as before."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import vitbench
import vitbench.host
from vitbench.catalog import MethodSpec, Reduction
from vitbench.engine import Reducer
from vitbench.engine import token_rules
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host


class _Step(Reducer):
    def __init__(self, step) -> None:  # type: ignore[no-untyped-def]
        self.step = step

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        return self.step(x)


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x[:, : 1 + (x.shape[1] - 1) // 2]


def _swap_cls(x: torch.Tensor) -> torch.Tensor:
    order = list(range(x.shape[1]))
    order[0], order[1] = 1, 0
    return _halve(x[:, order])


def _zero_cls_in_place(x: torch.Tensor) -> torch.Tensor:
    x[:, 0] = 0
    return _halve(x)


def _scale_in_place(x: torch.Tensor) -> torch.Tensor:
    return _halve(x.mul_(1.5))


def _swap_cls_in_large_batches(x: torch.Tensor) -> torch.Tensor:
    return _swap_cls(x) if x.shape[0] > 4 else _halve(x)


#: name: (the token step at block 3, what the error record says)
BROKEN = {
    "drops-images": (lambda x: x[:1], "token rule broken by drops-images at block 3: the step returns 1 of its "
                                      "4 images"),
    "zeroes-cls-in-place": (_zero_cls_in_place, "token rule broken by zeroes-cls-in-place at block 3: it drops or "
                                                "reorders the prefix tokens (image 0: cls dropped or changed)"),
    "scales-in-place": (_scale_in_place, "token rule broken by scales-in-place at block 3: it drops or reorders "
                                         "the prefix tokens (image 0: cls dropped or changed)"),
    "slices-cls": (lambda x: x[:, 1: 1 + (x.shape[1] - 1) // 2],
                   "token rule broken by slices-cls at block 3: it drops or reorders the prefix tokens "
                   "(image 0: cls dropped or changed)"),
    "swaps-cls": (_swap_cls, "token rule broken by swaps-cls at block 3: it drops or reorders the prefix tokens "
                             "(image 0: cls moved to position 1)"),
    "grows": (lambda x: torch.cat([x, x[:, -1:]], dim=1),
              "token rule broken by grows at block 3: the sequence grew from 65 to 66 tokens"),
}


@dataclass(frozen=True)
class _NoParams:
    pass


class _GrowsLater:
    """Keeps the rules for its first 4 images, then grows the sequence by one token."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return torch.cat([x, x[:, -1:]], dim=1) if self.seen > 4 else _halve(x)


def _drops_one_in_large_batches(x: torch.Tensor) -> torch.Tensor:
    return _halve(x[:-1] if x.shape[0] > 4 else x)


LARGE_BATCH_ONLY = {"large-batch-only": (_swap_cls_in_large_batches, ""),
                    "drops-one-timed": (_drops_one_in_large_batches, ""),
                    "grows-later": (_GrowsLater(), "")}


class _Broken:
    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        for name, (step, _) in (BROKEN | LARGE_BATCH_ONLY).items():
            register(MethodSpec(name=name, params=_NoParams,
                                build=lambda p, info, s=step: Reduction([_Step(s) if i == 3 else None
                                                                         for i in range(info.depth)])))


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> vitbench.Results:
    """One benchmark of the default model: the broken methods, then two correct ones."""
    get_host().add_plugin(_Broken(), "broken_token_rules")
    try:
        return vitbench.benchmark(methods=[*BROKEN, "tome", "topk"], metrics=["gmacs"], limit=4,
                                  out=tmp_path_factory.mktemp("checked"))
    finally:
        vitbench.host.reset_host()


def test_a_broken_token_rule_is_an_error_record_naming_it(checked: vitbench.Results) -> None:
    by_method = {x["method"]: x for x in checked.records}
    assert [by_method[m]["status"] for m in ("baseline", *BROKEN, "tome", "topk")] == \
        ["ok", *["error"] * len(BROKEN), "ok", "ok"]
    for name, (_, message) in BROKEN.items():
        assert by_method[name]["error"].startswith(message)
        assert by_method[name].get("gmacs") is None
    assert not checked.ok


def test_a_correct_method_is_measured_as_without_the_check(checked: vitbench.Results, tmp_path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(token_rules, "check_token_rules", lambda model, images, method=None: calls.append("x"))
    unchecked = vitbench.benchmark(methods=["tome", "topk"], metrics=["gmacs"], limit=4, out=tmp_path / "unchecked")
    assert calls == ["x"] * 4  # before and after measuring each method, not the baseline

    def gmacs(results: vitbench.Results) -> list:
        return [(x["method"], x["gmacs"], x["gmacs_std"]) for x in results.records if x["status"] == "ok"]

    assert gmacs(checked) == gmacs(unchecked) and len(gmacs(unchecked)) == 3


def test_a_rule_broken_only_in_large_batches_is_caught_on_the_scored_steps(tmp_path) -> None:
    """The check before measuring runs 4 images; every scored step is checked too, so a step that
    breaks a rule only in batches above 4 is an error record, and the plan's other methods run."""
    get_host().add_plugin(_Broken(), "broken_token_rules")
    try:
        results = vitbench.benchmark(methods=["large-batch-only", "tome"], metrics=["accuracy"], limit=16,
                                     out=tmp_path / "large")
    finally:
        vitbench.host.reset_host()
    by_method = {x["method"]: x for x in results.records}
    assert by_method["large-batch-only"]["status"] == "error"
    assert by_method["large-batch-only"]["error"].startswith(
        "token rule broken by large-batch-only at block 3: it drops or reorders the prefix tokens "
        "(image 0: cls moved to position 1)")
    assert by_method["large-batch-only"].get("top1_pct") is None
    assert by_method["tome"]["status"] == by_method["baseline"]["status"] == "ok"
    assert by_method["tome"]["num_images"] == 16


@pytest.mark.parametrize("method, said", [
    ("drops-one-timed", "token rule broken by drops-one-timed at block 3: the step returns 31 of its 32 images"),
    ("grows-later", "token rule broken by grows-later at block 3: the sequence grew from 65 to 66 tokens"),
])
def test_a_rule_broken_while_timed_is_an_error_record_without_accuracy(method: str, said: str, tmp_path) -> None:
    """With accuracy off no step is scored: the batch and growth rules are checked on every
    forward, timed ones too, and the whole check runs again after the timings."""
    get_host().add_plugin(_Broken(), "broken_token_rules")
    try:
        results = vitbench.benchmark(methods=[method, "tome"], metrics=["gmacs", "throughput"], quick=True,
                                     out=tmp_path / method)
    finally:
        vitbench.host.reset_host()
    by_method = {x["method"]: x for x in results.records}
    assert by_method[method]["status"] == "error" and by_method[method]["error"].startswith(said)
    assert by_method[method].get("throughput_img_s") is None
    assert by_method["tome"]["status"] == "ok" and by_method["tome"]["throughput_img_s"] > 0
