"""check_token_rules: each rule's violation names the method, the block and the rule; a correct
method passes and leaves the model as it was."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import vitbench
from vitbench.catalog import MethodSpec, Reduction
from vitbench.engine import Reducer, bipartite_soft_matching, reduction_context
from vitbench.engine.token_rules import CHECK_IMAGES, check_token_rules, token_rules_traced
from vitbench.errors import TokenRuleError, VitbenchError
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host
from vitbench.testing import tiny_deit_distilled, tiny_vit


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Step(Reducer):
    def __init__(self, step) -> None:  # type: ignore[no-untyped-def]
        self.step = step

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        return self.step(x, state)


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x[:, : 1 + (x.shape[1] - 1) // 2]


def _swap_cls(x: torch.Tensor, state) -> torch.Tensor:  # type: ignore[no-untyped-def]
    order = list(range(x.shape[1]))
    order[0], order[5] = 5, 0
    return _halve(x[:, order])


def _slice_after_merge(x: torch.Tensor, state) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Merges through the state (it now counts N - 8 tokens), then drops one more token behind its back."""
    x = state.merge(x, bipartite_soft_matching(x, 8, state.prefix))
    return x[:, :-1]


#: name: (the token step at block 3, the rule, what the message says)
BROKEN = {
    "rule-drops-cls": (lambda x, s: x[:, 1:], "prefix",
                       r"^token rule broken by rule-drops-cls at block 3: it drops or reorders the prefix tokens "
                       r"\(image 0: cls dropped or changed\); the 1 prefix token\(s\) \['cls'\] must stay first"),
    "rule-swaps-cls": (_swap_cls, "prefix",
                       r"^token rule broken by rule-swaps-cls at block 3: it drops or reorders the prefix tokens "
                       r"\(image 0: cls moved to position 5\)"),
    "rule-grows": (lambda x, s: torch.cat([x, x[:, -1:]], dim=1), "growth",
                   r"^token rule broken by rule-grows at block 3: the sequence grew from 65 to 66 tokens"),
    "rule-state": (_slice_after_merge, "state",
                   r"^token rule broken by rule-state at block 3: the step returns 56 tokens but the token "
                   r"state's size has 57 rows; reduce through TokenState.keep/merge/cluster"),
    "rule-keep-drops-cls": (lambda x, s: s.keep(x, torch.arange(1, 33).expand(x.shape[0], -1)), "prefix",
                            r"^token rule broken by rule-keep-drops-cls at block 3: TokenState.keep: the index "
                            r"drops prefix token\(s\) \[0\]"),
}


class _BrokenRules:
    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        for name, (step, _, _) in BROKEN.items():
            register(MethodSpec(name=name, params=_NoParams,
                                build=lambda p, info, s=step: Reduction([_Step(s) if i == 3 else None
                                                                         for i in range(info.depth)])))


@dataclass(frozen=True)
class _NoParams:
    pass


@pytest.fixture
def broken_rules() -> None:
    get_host().add_plugin(_BrokenRules(), "broken_rules")


def _images(n: int = CHECK_IMAGES) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_broken_rule_is_named(broken_rules, name: str) -> None:
    model = vitbench.apply(tiny_vit(), name)
    with pytest.raises(TokenRuleError, match=BROKEN[name][2]) as info:
        check_token_rules(model, _images())
    assert isinstance(info.value, VitbenchError) and (info.value.rule, info.value.block) == (BROKEN[name][1], 3)


def test_a_correct_method_passes_and_the_model_is_left_as_it_was() -> None:
    model = vitbench.apply(tiny_vit(), "tome", r=8).train()
    model.blocks[3].reducer.note = [1]  # a reducer attribute the forward must not be seen to change
    context = reduction_context(model)
    before = dict(vars(context))
    x = _images(2)
    check_token_rules(model, _images(16))
    assert vars(context) == before and context.state is None and context.token_counts == []
    assert model.training and all(m.training for m in model.modules())  # the modes are put back
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.blocks)  # no trace left
    with torch.no_grad():
        out = model.eval()(x)
    assert context.token_counts == [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]
    assert torch.equal(out, vitbench.apply(tiny_vit(), "tome", r=8).eval()(x).detach())


def test_observed_state_and_buffers_are_put_back() -> None:
    """DCS remembers the last forward's token count (its compute budget reads it); the check's
    4-image forward must not leave it, nor change a buffer or the random state."""
    model = vitbench.apply(tiny_vit(), "dcs").eval()
    with torch.no_grad():
        model(_images(2))
    reducers = [b.reducer for b in model.blocks if b.reducer is not None]
    shapes = [r._last_shape for r in reducers]
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    rng = torch.get_rng_state()
    check_token_rules(model, _images(8))
    assert [r._last_shape for r in reducers] == shapes and shapes[0][0] == 2 * 65
    assert all(torch.equal(v, dict(model.named_buffers())[k]) for k, v in buffers.items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_an_unreduced_model_passes_and_the_trace_needs_a_reduced_one() -> None:
    check_token_rules(tiny_vit(), _images())
    with pytest.raises(ValueError, match="not reduced"):
        with token_rules_traced(tiny_vit()):
            pass


def test_the_prefix_names_follow_the_model(broken_rules) -> None:
    model = vitbench.apply(tiny_deit_distilled(), "rule-drops-cls")
    with pytest.raises(TokenRuleError, match=r"\(image 0: cls dropped or changed, dist moved to position 0\); "
                                             r"the 2 prefix token\(s\) \['cls', 'dist'\]"):
        check_token_rules(model, _images())



def test_a_nan_class_token_passed_on_unchanged_breaks_no_rule():
    """NaN from an earlier block is the NaN guards' to report (an error naming where it became
    non-finite), not a token rule's; a step that turns a finite class token into NaN breaks one."""
    from types import SimpleNamespace

    from vitbench.engine.token_rules import _RuleTrace

    trace = _RuleTrace("m", torch.nn.Identity(), ["cls"])
    state = SimpleNamespace(prefix=1, size=None, source=None)
    x = torch.randn(2, 5, 8)
    x[:, 0] = float("nan")
    trace.check(3, x, state, x[:, :3])  # the NaN class token kept in place: no error
    finite = torch.randn(2, 5, 8)
    with pytest.raises(TokenRuleError, match="at block 3"):
        trace.check(3, finite, state, torch.cat([finite[:, :1] * float("nan"), finite[:, 1:3]], dim=1))
