"""vitbench.engine.Reducer: the declared reducer contract, its no-op defaults, and who must follow it."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.models.swin_transformer import SwinTransformer
from torch import nn

import vitbench
from vitbench.catalog import Reduction
from vitbench.engine import AttnInfo, LiteMLAHooks, Reducer, TileUnmerge, TokenState, reduction_context
from vitbench_plugins.efficientvit_family import adapter as efficientvit
from vitbench_plugins.vit_family import adapter as vit
from vitbench.engine.token_rules import _RuleTrace, traced
from vitbench.errors import PluginError, UnsupportedError
from vitbench.testing import check_prefix_tokens
from vitbench.host import get_host
from vitbench.testing import tiny_vit


def _tiny_swin() -> nn.Module:
    torch.manual_seed(0)
    return SwinTransformer(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                           num_classes=10).eval()


def _tiny_mobilevit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("mobilevit_xs", pretrained=False, num_classes=10).eval()


def _tiny_efficientvit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("efficientvit_b1", pretrained=False, num_classes=10).eval()


#: one small model per built-in family
FAMILY_MODELS = {"vit": tiny_vit, "swin": _tiny_swin, "mobilevit": _tiny_mobilevit,
                 "efficientvit": _tiny_efficientvit}


class _KeepAll(Reducer):
    """A token step that keeps every token; every other member is the default."""

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        return x


#: each small model's input side
FAMILY_SIDES = {"vit": 32, "swin": 56, "mobilevit": 256, "efficientvit": 224}


@pytest.mark.parametrize("family", list(FAMILY_MODELS))
def test_every_method_a_family_provides_for_runs_on_it(family: str) -> None:
    """Every built-in method whose needs the family provides builds reducers on it and runs a
    forward of the model's output shape with finite values; the others are refused in one line."""
    host = get_host()
    methods = [name for name in host.names("methods") if family in host.families_for(host.method(name))]
    assert methods, f"no built-in method supports {family}"
    base = FAMILY_MODELS[family]()
    assert host.family_of(base).name == family
    x = torch.randn(1, 3, FAMILY_SIDES[family], FAMILY_SIDES[family], generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = base(x).shape
    for name in methods:
        reduced = vitbench.apply(copy.deepcopy(base), name)
        reduction = reduction_context(reduced).reduction
        built = [r for r in reduction.reducers if r is not None]
        assert built or reduction.input_grid is not None, f"{name} built no reducer on {family}"  # downsample: none
        assert all(isinstance(r, vitbench.engine.Reducer) for r in built), (name, family, built)
        with torch.inference_mode():
            y = reduced(x)
        assert y.shape == expected and torch.isfinite(y).all(), (name, family)
    for name in sorted(set(host.names("methods")) - set(methods)):
        missing = ", ".join(sorted(host.method(name).needs - host.family(family).provides))
        with pytest.raises(UnsupportedError, match=f"method '{name}' needs {missing}, which the '{family}' family"):
            vitbench.apply(copy.deepcopy(base), name)


def test_a_reduction_asking_for_what_the_family_lacks_is_refused_in_one_line() -> None:
    """A method whose declared needs the family provides, but whose built reducers ask for more
    (here: the full attention on Swin), is refused before the model is patched."""
    base = _tiny_swin()
    spec = get_host().method("tome")
    reduction = Reduction(reducers=[_AsksForAttention()] * 4)
    spec_build = spec.build
    try:
        object.__setattr__(spec, "build", lambda values, info: reduction)
        with pytest.raises(UnsupportedError, match=r"^method 'tome' needs attn, which the 'swin' family "
                                                   r"\(SwinTransformer\) does not provide; tome runs on: "):
            vitbench.apply(base, "tome")
    finally:
        object.__setattr__(spec, "build", spec_build)
    assert reduction_context(base) is None


class _AsksForAttention(_KeepAll):
    needs = frozenset({"attn"})


def test_the_defaults_change_nothing() -> None:
    r = _KeepAll()
    q, k, x = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 5, 12)
    assert r.qk(q, k, x)[0] is q and r.qk(q, k, x)[1] is k
    mlp = nn.Linear(12, 12)
    assert torch.equal(r.mlp_forward(mlp, x), mlp(x))
    assert r.observe(mlp, x) is None
    assert (r.needs, r.selects_channels, r.records_grid_merge, r.before_attention) == (frozenset(), False, False, False)


def test_the_family_mixins_defaults_change_nothing_and_reducer_carries_none_of_them() -> None:
    class Both(_KeepAll, LiteMLAHooks, TileUnmerge):
        pass

    r, proj, maps, x = Both(), nn.Conv2d(12, 6, 1), torch.randn(2, 12, 3, 3), torch.randn(2, 5, 12)
    assert torch.equal(r.proj_forward(proj, maps), proj(maps))
    assert r.selected_heads() is None and r.unmerge(x, TokenState(prefix=0)) is None
    assert not any(hasattr(_KeepAll(), name) for name in ("proj_forward", "selected_heads", "unmerge"))


def test_a_family_hook_without_its_mixin_is_refused_when_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match=r"Tiles defines unmerge without inheriting vitbench.kit.TileUnmerge"):
        class Tiles(_KeepAll):
            def unmerge(self, y, state):  # type: ignore[no-untyped-def]
                return y


def test_the_rule_check_keeps_a_reducers_family_hooks() -> None:
    class Unmerging(_KeepAll, TileUnmerge):
        def unmerge(self, y, state):  # type: ignore[no-untyped-def]
            return y * 2

    wrapped = traced(Unmerging(), _RuleTrace("m", nn.Identity(), []), 0)
    y = torch.ones(1, 3, 4)
    assert isinstance(wrapped, TileUnmerge) and not isinstance(wrapped, LiteMLAHooks)
    assert torch.equal(wrapped.unmerge(y, TokenState(prefix=0)), y * 2)
    assert not isinstance(traced(_KeepAll(), _RuleTrace("m", nn.Identity(), []), 0), TileUnmerge)


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_a_reducer_with_only_a_token_step_that_keeps_everything_is_the_model(family: str) -> None:
    base = FAMILY_MODELS[family]()
    spec = get_host().family(family)
    model = spec.patch(copy.deepcopy(base), Reduction([_KeepAll()] * spec.describe(base).depth), method="keep")
    x = torch.randn(2, 3, 56 if family == "swin" else 32, 56 if family == "swin" else 32)
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))


def test_a_channel_reducer_with_the_default_hooks_is_efficientvit() -> None:
    class Channels(Reducer):
        selects_channels = True

    base = _tiny_efficientvit()
    model = efficientvit.patch(copy.deepcopy(base), Reduction([Channels()] * 7), method="channels")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))


def test_a_module_reducer_runs_forward_and_trains() -> None:
    class Scale(nn.Module, Reducer):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))
            self.calls = 0

        def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
            self.calls += 1
            return x * self.scale

    reducer = Scale()
    assert type(reducer).__call__ is nn.Module.__call__
    model = vit.patch(tiny_vit(), Reduction([None] * 3 + [reducer] + [None] * 8), method="scale")
    assert dict(model.named_parameters())["blocks.3.reducer.scale"] is reducer.scale
    hooked = []
    reducer.register_forward_hook(lambda m, args, out: hooked.append(out.shape))
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert reducer.calls == 1 and hooked == [torch.Size([2, 65, 48])]
    assert reducer.scale.grad is not None and reducer.scale.grad.abs().item() > 0
    torch.optim.SGD([reducer.scale], lr=0.1).step()
    assert reducer.scale.item() != 1.0


def test_a_module_reducer_must_list_nn_module_first() -> None:
    with pytest.raises(TypeError, match=r"Late: list nn.Module before Reducer \(class Late\(nn.Module, Reducer\)\)"):
        class Late(Reducer, nn.Module):
            def forward(self, x, state, info):  # type: ignore[no-untyped-def]
                return x


def test_a_reducer_without_a_token_step_says_so() -> None:
    class NoStep(Reducer):
        pass

    with pytest.raises(NotImplementedError, match=r"NoStep has no token step: define __call__\(x, state, info\)"):
        NoStep()(torch.zeros(1, 2, 3), TokenState(prefix=0), AttnInfo())


def test_a_plain_callable_is_refused_when_the_model_is_patched() -> None:
    def plain(x, state, info):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(PluginError, match=r"method 'plain': block 2's reducer 'function' is not a "
                                          r"vitbench.engine.Reducer; subclass it"):
        vit.patch(tiny_vit(), Reduction([None, None, plain] + [None] * 9), method="plain")


class _KeepFirstEarly(Reducer):
    """Keep the first ``k`` tokens, before the block's attention."""

    before_attention = True

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        assert info == AttnInfo()  # nothing from an attention that has not run yet
        return state.keep(x, torch.arange(self.k).expand(x.shape[0], self.k))


def test_a_reducer_before_the_attention_reduces_the_blocks_input() -> None:
    """Keeping 20 tokens before block 1's attention is the plain model with the tokens sliced
    between blocks 0 and 1 (and stays so under the token-rule trace, which wraps the reducer)."""
    base = tiny_vit()
    model = vit.patch(copy.deepcopy(base), Reduction([None, _KeepFirstEarly(20)] + [None] * 10), method="early")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        tokens = base.blocks[0](base.norm_pre(base._pos_embed(base.patch_embed(x))))[:, :20]
        for blk in base.blocks[1:]:
            tokens = blk(tokens)
        expected = base.forward_head(base.norm(tokens))
        assert torch.allclose(model(x), expected, atol=1e-5)
        assert reduction_context(model).token_counts == [65] + [20] * 11
        assert torch.allclose(check_prefix_tokens(model, x), expected, atol=1e-5)


def test_a_reducer_before_the_attention_may_not_ask_for_what_the_attention_gives() -> None:
    reducer = _KeepFirstEarly(20)
    reducer.needs = frozenset({"keys"})
    with pytest.raises(PluginError, match=r"block 1: a reducer that runs before the attention gets nothing from "
                                          r"it; its needs must be empty, not \['keys'\]"):
        vit.patch(tiny_vit(), Reduction([None, reducer] + [None] * 10), method="early")


@pytest.mark.parametrize("family", ["swin", "efficientvit"])
def test_families_whose_blocks_reduce_after_the_attention_refuse_an_early_reducer(family: str) -> None:
    base = FAMILY_MODELS[family]()
    spec = get_host().family(family)
    reducers = [_KeepFirstEarly(4)] * spec.describe(base).depth
    with pytest.raises(UnsupportedError, match=r"^early needs before_attention(, token_steps)?, which this model "
                                               r"family does not provide"):
        spec.patch(base, Reduction(reducers), method="early")
