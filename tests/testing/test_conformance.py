"""vitbench.testing.check_method: every built-in conforms; broken methods fail with a reason."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import vitbench.host
from vitbench.catalog import MethodSpec, Reduction
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl
from vitbench.host import PluginHost
import vitbench
from vitbench.engine import Reducer, reduction_context
from vitbench.testing import (
    PREFIX_MODELS, check_method, check_prefix_tokens, tiny_deit_distilled, tiny_vit, tiny_vit_registers,
)


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
    ("dpc-knn", {}, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),  # keep 0.5 at blocks 3, 6, 9
    ("kmedoids", {}, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),
    ("atc", {}, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),
    ("tofu", {"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),  # ToMe's counts
    ("pitome", {"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ("mctf", {"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ("zero-tprune", {"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ("diffrate", {}, [61, 57, 54, 50, 46, 42, 39, 35, 31, 27, 24, 20]),  # even steps to keep=0.3
])
def test_every_builtin_conforms(vitbench_check_method, method, params, counts) -> None:
    report = vitbench_check_method(method, params)
    assert (report.method, report.token_counts, report.output_shape) == (method, counts, (2, 10))


@pytest.mark.parametrize("method, reduces, counts", [
    ("ltm", True, [46] * 12),  # untrained: average pooling to ceil(0.7 * 64) tokens after block 0
    ("ltmp", False, [65] * 12),  # untrained thresholds (0.9, 0.0) remove nothing on random weights
    ("dcs", False, [65] * 12),  # channels, not tokens
    ("diffrate-search", False, [65] * 12),  # the search starts from removing nothing
    ("dynamicvit", True, [65] * 3 + [46] * 3 + [33] * 3 + [23] * 3),  # ceil(0.7^s * 64) patches, trained or not
    ("sinkhorn", True, [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3),  # one token per centre, trained or not
    ("cropr", True, [65, 56, 48, 40, 32, 24, 16, 8, 2, 2, 2, 2]),  # 9, then 8 before each block, trained or not
])
def test_the_learnable_builtins_conform_untrained(vitbench_check_method, method, reduces, counts) -> None:
    report = vitbench_check_method(method, reduces_tokens=reduces)
    assert (report.token_counts, report.output_shape) == (counts, (2, 10))


@pytest.mark.parametrize("factory", [tiny_vit, tiny_deit_distilled, tiny_vit_registers])
def test_ltmp_keeps_the_prefix_first_when_it_merges_and_pads(factory) -> None:
    """Thresholds that merge and prune a different number of tokens per image: the padded
    inference layout still starts with the prefix tokens, in order, untouched."""
    model = vitbench.apply(factory(), "ltmp")
    with torch.no_grad():
        for block in model.blocks:
            block.reducer.theta_m.fill_(0.6)
            block.reducer.theta_p.fill_(0.012)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        check_prefix_tokens(model, x)
    counts = reduction_context(model).state.private["ltmp_counts"]
    assert counts[11].max() < 30 and len(set(counts[0].tolist())) > 1  # it did reduce, per image


def test_check_prefix_tokens_refuses_an_unreduced_model() -> None:
    with pytest.raises(AssertionError, match="the model is not reduced"):
        check_prefix_tokens(tiny_vit(), torch.randn(1, 3, 32, 32))


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


class _Step(Reducer):
    """A plain reducer whose token step is ``step(x, state)``."""

    def __init__(self, step, needs: frozenset) -> None:  # type: ignore[no-untyped-def]
        self.step, self.needs = step, needs

    def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
        return self.step(x, state)


def _reducer(step, needs=frozenset()):  # type: ignore[no-untyped-def]
    return _Step(lambda x, state: step(x), needs)


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x[:, : 1 + (x.shape[1] - 1) // 2]


def _patch_noise(x: torch.Tensor) -> torch.Tensor:
    """Noise on the patch tokens only (noise on the class token would also break the prefix rule)."""
    noise = torch.randn_like(x)
    noise[:, 0] = 0
    return noise


def _with_state(step, needs=frozenset()):  # type: ignore[no-untyped-def]
    return _Step(step, needs)


def _plain_function(x, state, info):  # type: ignore[no-untyped-def]
    """A token step that is not a :class:`~vitbench.engine.Reducer`."""
    return _halve(x)


def _swap(x: torch.Tensor, i: int, j: int) -> torch.Tensor:
    order = list(range(x.shape[1]))
    order[i], order[j] = j, i
    return x[:, order]


def _swap_first_prefix_pair(x: torch.Tensor, state) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """cls <-> dist on the distilled model; harmless with one prefix token."""
    return _halve(_swap(x, 0, 1) if state.prefix >= 2 else x)


def _swap_registers(x: torch.Tensor, state) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return _halve(_swap(x, 1, 2) if state.prefix >= 3 else x)


class _SwappingModule(torch.nn.Module, Reducer):
    """A learnable-style reducer (an nn.Module, traced by a forward hook) that swaps cls and dist."""

    needs: frozenset = frozenset()

    def forward(self, x: torch.Tensor, state, info) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return _swap_first_prefix_pair(x, state)


def _keep_index(x: torch.Tensor, state, head: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """``state.keep`` with the given head instead of the prefix, then half the patches."""
    p = state.prefix
    patches = torch.arange(p, p + (x.shape[1] - p) // 2)
    return state.keep(x, torch.cat([torch.tensor(head), patches]).expand(x.shape[0], -1))


BROKEN = {  # name: (params, reducer at block 3, the reason check_method must give)
    "grows": (NoParams, _reducer(lambda x: torch.cat([x, x[:, -1:]], dim=1)), r"token rule broken by grows at block 3: the sequence grew from 65 to 66 tokens"),
    "drops-images": (NoParams, _reducer(lambda x: _halve(x)[:1]), r"token rule broken by drops-images at block 3: the step returns 1 of its 2 images"),
    "noisy": (NoParams, _reducer(lambda x: _halve(x) + _patch_noise(_halve(x))), "noisy: two eval forwards on CPU differ"),
    "no-op": (NoParams, _reducer(lambda x: x), r"no-op: tokens did not shrink \(65 -> \[65, 65,"),
    "greedy": (NoParams, _reducer(_halve, frozenset({"keys", "queries"})),
               r"greedy: method 'greedy' needs queries, which the 'vit' family \(VisionTransformer\) does not provide"),
    "required": (RequiredParams, _reducer(_halve), r"required: the default parameters are not valid: .*amount"),
    "bad-default": (BadDefaultParams, _reducer(_halve),
                    r"bad-default: the default parameters are not valid: bad-default\.amount=-1 is out of range"),
    # the prefix rule (docs/token-state.md): traced through the reducer on 1, 2 and 3 prefix tokens
    "drops-cls": (NoParams, _reducer(lambda x: x[:, 1: 1 + (x.shape[1] - 1) // 2]),
                  r"token rule broken by drops-cls at block 3: it drops or reorders the prefix tokens \(image 0: cls dropped or changed\); "
                  r"the 1 prefix token\(s\) \['cls'\] must stay first, in order, unchanged"),
    "prefix-last": (NoParams, _reducer(lambda x: torch.cat([_halve(x)[:, 1:], x[:, :1]], dim=1)),
                    r"token rule broken by prefix-last at block 3: .* \(image 0: cls moved to position 32\)"),
    "merges-cls": (NoParams, _reducer(lambda x: torch.cat([(x[:, :1] + x[:, 1:2]) / 2, _halve(x)[:, 2:]], dim=1)),
                   r"token rule broken by merges-cls at block 3: .* \(image 0: cls dropped or changed\)"),
    "swaps-cls-dist": (NoParams, _with_state(_swap_first_prefix_pair),
                       r"token rule broken by swaps-cls-dist at block 3: it drops or reorders the prefix tokens \(image 0: cls moved to "
                       r"position 1, dist moved to position 0\); the 2 prefix token\(s\) \['cls', 'dist'\]"),
    "module-swaps": (NoParams, _SwappingModule(),
                     r"token rule broken by module-swaps at block 3: it drops or reorders the prefix tokens \(image 0: cls moved to "
                     r"position 1, dist moved to position 0\)"),
    "swaps-registers": (NoParams, _with_state(_swap_registers),
                        r"token rule broken by swaps-registers at block 3: .* \(image 0: reg0 moved to position 2, reg1 moved to "
                        r"position 1\); the 3 prefix token\(s\) \['cls', 'reg0', 'reg1'\]"),
    "keep-drops-cls": (NoParams, _with_state(lambda x, s: _keep_index(x, s, list(range(1, s.prefix + 1)))),
                       r"token rule broken by keep-drops-cls at block 3: TokenState.keep: the index drops prefix token\(s\) \[0\] for image 0"),
    "keep-swaps": (NoParams, _with_state(lambda x, s: _keep_index(x, s, list(range(s.prefix))[::-1])),
                   r"token rule broken by keep-swaps at block 3: TokenState.keep: the index reorders the prefix tokens \(its row starts \[1, 0\]\)"),
    "not-a-reducer": (NoParams, _plain_function,
                      r"not-a-reducer: block 3's reducer 'function' is not a vitbench.engine.Reducer; subclass it"),
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
    monkeypatch.setattr(vitbench.host, "_HOST", host)
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


def test_the_prefix_models_have_the_prefix_tokens_they_claim() -> None:
    distilled, registers = tiny_deit_distilled(), tiny_vit_registers()
    assert distilled.num_prefix_tokens == 2 and distilled.dist_token is not None
    assert registers.num_prefix_tokens == 3 and registers.num_reg_tokens == 2
    assert PREFIX_MODELS == (tiny_deit_distilled, tiny_vit_registers)


def test_a_prefix_swap_only_seen_with_several_prefix_tokens_needs_the_prefix_models(broken_host: PluginHost) -> None:
    """With one prefix token the cls<->dist swap is a plain halving: the main model alone passes."""
    assert check_method("swaps-cls-dist", prefix_models=()).token_counts[3] == 33


class FixedBlocks:
    """A method whose default blocks, (3, 6, 9), exist only on a model of 10 blocks or more."""

    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        from vitbench.kit import check_layers

        def build(params, info):  # type: ignore[no-untyped-def]
            check_layers("fixed-blocks", (3, 6, 9), info.depth)
            return Reduction([_reducer(_halve) if i in (3, 6, 9) else None for i in range(info.depth)])

        register(MethodSpec(name="fixed-blocks", params=NoParams, build=build))


def test_defaults_that_do_not_fit_a_6_block_vit_fail_the_check(broken_host: PluginHost) -> None:
    broken_host.add_plugin(FixedBlocks(), "fixed_blocks", "test-fixed-blocks", "0.0")
    with pytest.raises(AssertionError, match=r"fixed-blocks: the default parameters do not fit a 6-block ViT: "
                                             r"fixed-blocks.layers contains 6; valid block indices for this model: 0..5"):
        check_method("fixed-blocks")
