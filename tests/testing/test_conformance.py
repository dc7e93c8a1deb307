"""vitbench.testing.check_method: every built-in conforms; broken methods fail with a reason."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import vitbench.plugins
from vitbench.catalog import MethodSpec, Reduction
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.plugins import PluginHost
from vitbench.testing import check_method


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny model's tensors are too small for threads; on a busy CPU they only cost time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("method, params, counts", [
    ("tome", {"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ("ppt", {}, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),
    ("entropy", {}, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),
    ("average", {}, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),
    ("topk", {}, [65] * 3 + [46] * 3 + [33] * 3 + [24] * 3),
    ("topk", {"fuse": True}, [65] * 3 + [47] * 3 + [35] * 3 + [26] * 3),
])
def test_every_builtin_conforms(vitbench_check_method, method, params, counts) -> None:
    report = vitbench_check_method(method, params)
    assert (report.method, report.token_counts, report.output_shape) == (method, counts, (2, 10))


def test_the_tiny_vit_fixture_is_deterministic(vitbench_tiny_vit) -> None:
    a, b = vitbench_tiny_vit(), vitbench_tiny_vit()
    assert len(a.blocks) == 12 and a.patch_embed.num_patches == 64 and not a.training
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# -- deliberately broken methods -------------------------------------------------------------
@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class RequiredParams:
    amount: int


@dataclass(frozen=True)
class BadDefaultParams:
    amount: int = -1

    def __post_init__(self) -> None:
        if self.amount < 0:
            raise ParamError(f"bad-default.amount={self.amount} is out of range; it must be >= 0")


def _reducer(step, needs=frozenset()):  # type: ignore[no-untyped-def]
    def reducer(x, state, info):  # type: ignore[no-untyped-def]
        return step(x)
    reducer.needs = needs
    return reducer


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x[:, : 1 + (x.shape[1] - 1) // 2]


BROKEN = {  # name: (params, reducer at block 3, the reason check_method must give)
    "grows": (NoParams, _reducer(lambda x: torch.cat([x, x[:, -1:]], dim=1)), r"grows: tokens grew: \[65, 65, 65, 66,"),
    "drops-images": (NoParams, _reducer(lambda x: _halve(x)[:1]), r"drops-images: output shape \(1, 10\) != \(2, 10\)"),
    "noisy": (NoParams, _reducer(lambda x: _halve(x) + torch.randn_like(_halve(x))), "noisy: two eval forwards on CPU differ"),
    "no-op": (NoParams, _reducer(lambda x: x), r"no-op: tokens did not shrink \(65 -> \[65, 65,"),
    "greedy": (NoParams, _reducer(_halve, frozenset({"keys", "queries"})),
               r"greedy: block 3 asks for \['queries'\]; available: \['attn', 'cls_attn', 'keys', 'values'\]"),
    "required": (RequiredParams, _reducer(_halve), r"required: the default parameters are not valid: .*amount"),
    "bad-default": (BadDefaultParams, _reducer(_halve),
                    r"bad-default: the default parameters are not valid: bad-default\.amount=-1 is out of range"),
}


class BrokenMethods:
    """A plugin whose methods each break one rule of the method contract."""

    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        for name, (params, reducer, _) in BROKEN.items():
            register(MethodSpec(name=name, params=params,
                                build=lambda p, info, r=reducer: Reduction([r if i == 3 else None
                                                                            for i in range(info.depth)])))


@pytest.fixture
def broken_host(monkeypatch: pytest.MonkeyPatch) -> PluginHost:
    """A fresh host of the installed plugins plus :class:`BrokenMethods`, made the process-wide one."""
    host = PluginHost()
    host.load_entry_points()
    host.add_plugin(BrokenMethods(), "broken_methods", "test-broken-methods", "0.0")
    monkeypatch.setattr(vitbench.plugins, "_HOST", host)
    return host


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_method_fails_the_check_with_its_reason(broken_host: PluginHost, name: str) -> None:
    assert broken_host.owner("methods", name) == "broken_methods"
    with pytest.raises(AssertionError, match=BROKEN[name][2]):
        check_method(name)


def test_a_method_that_keeps_tokens_passes_when_it_says_so(broken_host: PluginHost) -> None:
    assert check_method("no-op", reduces_tokens=False).token_counts == [65] * 12


def test_the_builtins_still_conform_beside_broken_plugins(broken_host: PluginHost) -> None:
    assert check_method("tome", {"r": 8}).token_counts[-1] == 2
