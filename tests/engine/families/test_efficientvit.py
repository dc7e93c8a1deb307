"""The EfficientViT family adapter (MIT EfficientViT, timm ``EfficientVit``): description of its
LiteMLA blocks, transparent patching, the channel hooks, refusals (token methods, Microsoft's
EfficientViT). Random-init ``efficientvit_b1`` at 64x64, eval mode, seeded."""
from __future__ import annotations

import copy

import pytest
import timm
import torch

import vitbench
from vitbench.catalog import Reduction
from vitbench.engine import LiteMLAHooks, Reducer, reduction_context
from vitbench_plugins.efficientvit_family.adapter import (
    BRANCHES,
    ReducingLiteMLA,
    describe,
    patch,
)
from vitbench.errors import UnsupportedError
from vitbench.host import get_host

SIZE = 64
DIMS = [128] * 3 + [256] * 4
HEADS = [8] * 3 + [16] * 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One thread: the 2-core machines run other tests beside these (much faster than 2)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(**kwargs):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return timm.create_model("efficientvit_b1", pretrained=False, num_classes=10, **kwargs).eval()


def _images(n: int = 2, size: int = SIZE) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def _mla_inputs(model, x):  # type: ignore[no-untyped-def]
    """The input map shape of every LiteMLA in a real forward."""
    from timm.models.efficientvit_mit import LiteMLA

    seen: list[tuple[int, ...]] = []
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))
             for m in model.modules() if isinstance(m, LiteMLA)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def test_registered_and_described():
    model = _model()
    assert get_host().family_of(model).name == "efficientvit"
    assert "efficientvit_b*" in get_host().family("efficientvit").model_patterns
    info = describe(model)
    assert (info.family, info.depth, info.embed_dim, info.num_heads) == ("efficientvit", 7, 128, 8)
    assert (info.num_prefix_tokens, info.global_pool, info.input_size) == (0, "avg", (224, 224))
    assert (info.grid, info.num_patches, info.num_tokens) == ((14, 14), 196, 196)
    assert [b.dim for b in info.blocks] == DIMS and [b.num_heads for b in info.blocks] == HEADS
    assert [b.grid for b in info.blocks] == [(14, 14)] * 3 + [(7, 7)] * 4
    assert [b.sequence for b in info.blocks] == [0] * 3 + [1] * 4  # a stage's LiteMLAs share its map
    assert [b.first for b in info.blocks] == [True, False, False, True, False, False, False]
    assert all(b.dim // b.num_heads == 16 for b in info.blocks) and BRANCHES == 2


@pytest.mark.parametrize("size", [64, 100])
def test_grids_follow_the_detection_input_size(size):
    model = _model()
    model.vitbench_input_size = (size, size)
    info = describe(model)
    assert info.input_size == (size, size)
    seen = _mla_inputs(model, _images(1, size))
    assert [(b.dim, *b.grid) for b in info.blocks] == [s[1:] for s in seen]
    assert [b.num_patches for b in info.blocks] == [s[2] * s[3] for s in seen]


def test_no_reducers_is_bit_identical_and_keeps_timm_keys():
    base = _model()
    model = patch(copy.deepcopy(base), Reduction([None] * 7), method="none")
    wrappers = [m for m in model.modules() if isinstance(m, ReducingLiteMLA)]
    assert len(wrappers) == 7 and [w.index for w in wrappers] == list(range(7))
    assert isinstance(model.stages[2].blocks[1].context_module.main, ReducingLiteMLA)
    x = _images()
    with torch.no_grad():
        assert torch.equal(model(x), base(x))
        assert torch.equal(model.forward_features(x), base.forward_features(x))
        final, maps = model.forward_intermediates(x)
        final0, maps0 = base.forward_intermediates(x)
    assert torch.equal(final, final0)
    assert [m.shape for m in maps] == [m.shape for m in maps0] == [
        (2, 32, 16, 16), (2, 64, 8, 8), (2, 128, 4, 4), (2, 256, 2, 2)]
    assert all(torch.equal(a, b) for a, b in zip(maps, maps0))
    assert list(model.state_dict()) == list(base.state_dict())
    model.load_state_dict(base.state_dict(), strict=True)
    ctx = reduction_context(model)
    assert ctx.method == "none" and ctx.prefix == 0 and torch.equal(ctx.inputs, x)
    assert ctx.token_counts == [16] * 3 + [4] * 4  # map positions per LiteMLA; nothing reduced


class _Hooks(torch.nn.Module, Reducer, LiteMLAHooks):
    """A channel reducer with identity hooks that records what they receive."""

    selects_channels = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[tuple[int, ...], ...]] = []

    def qk(self, q, k, x):  # type: ignore[no-untyped-def]
        self.seen.append((tuple(q.shape), tuple(k.shape), tuple(x.shape)))
        return q, k

    def proj_forward(self, proj, out):  # type: ignore[no-untyped-def]
        self.seen.append((tuple(out.shape),))
        return proj(out)


def test_identity_hooks_rerun_timm_exactly_and_see_the_documented_shapes():
    base = _model()
    reducers = [_Hooks() for _ in range(7)]
    model = patch(copy.deepcopy(base), Reduction(reducers), method="hooks")
    x = _images()
    with torch.no_grad():
        assert torch.equal(model(x), base(x))
    q, k, tokens = reducers[0].seen[0]
    assert q == k == (2, BRANCHES * 8, 16, 16) and tokens == (2, 16, 128)
    assert reducers[0].seen[1] == ((2, BRANCHES * 128, 4, 4),)
    assert reducers[3].seen[0][0] == (2, BRANCHES * 16, 4, 16) and reducers[3].seen[1] == ((2, 512, 2, 2),)


def test_heads_used_runs_only_those_heads():
    heads = torch.tensor([1, 9])  # head 1 of the 1x1 branch, head 1 of the 5x5 branch
    channels = (heads[:, None] * 16 + torch.arange(16)).flatten()

    class TwoHeads(_Hooks):
        def selected_heads(self):  # type: ignore[no-untyped-def]
            return heads

        def proj_forward(self, proj, out):  # type: ignore[no-untyped-def]
            self.out = out
            full = out.new_zeros(out.shape[0], 256, *out.shape[2:])
            full[:, channels] = out
            return proj(full)

    base = _model()
    reducer = TwoHeads()
    model = patch(copy.deepcopy(base), Reduction([reducer] + [None] * 6), method="hooks")
    full: list[torch.Tensor] = []
    base.stages[2].blocks[1].context_module.main.proj.register_forward_pre_hook(
        lambda mod, args: full.append(args[0]))
    x = _images()
    with torch.no_grad():
        base(x)
        model(x)
    assert reducer.seen[0][0] == (2, 2, 16, 16) and reducer.out.shape == (2, 32, 4, 4)
    assert torch.allclose(reducer.out, full[0][:, channels], atol=1e-6)


@pytest.mark.parametrize("method", ["tome", "topk", "ppt", "ltmp"])
def test_token_methods_are_refused(method):
    with pytest.raises(UnsupportedError, match=f"method '{method}' needs .*token_steps.*, which the 'efficientvit' "
                                               f"family \\(EfficientVit\\) does not provide"):
        vitbench.apply(_model(), method)


def test_a_token_reducer_without_a_grid_merge_is_refused_by_patch():
    class TokenStep(Reducer):
        def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
            return x

    with pytest.raises(UnsupportedError, match=r"^mine needs token_steps, which this model family does not provide "
                                               r"\(it provides channels, grid_merges\)"):
        patch(_model(), Reduction([TokenStep()] * 7), method="mine")


def test_token_and_channel_reducers_are_not_mixed():
    class TokenStep(Reducer):
        records_grid_merge = True

        def __call__(self, x, state, info):  # type: ignore[no-untyped-def]
            return x

    class Channels(Reducer):
        selects_channels = True

    with pytest.raises(UnsupportedError, match="block 1's reducer selects channels and others reduce tokens"):
        patch(_model(), Reduction([TokenStep(), Channels()] + [None] * 5), method="mix")


def test_microsoft_efficientvit_is_refused_clearly():
    msra = timm.create_model("efficientvit_m0", pretrained=False)
    with pytest.raises(UnsupportedError, match=r"EfficientVitMsra \(Microsoft's EfficientViT.*\) is not "
                                               r"supported; .*EfficientVit \(MIT EfficientViT"):
        vitbench.apply(msra, "dcs")


def test_patching_twice_and_wrong_reducer_counts_are_refused():
    model = patch(_model(), Reduction([None] * 7))
    with pytest.raises(UnsupportedError, match="already reduced"):
        patch(model, Reduction([None] * 7))
    with pytest.raises(ValueError, match="3 reducers for 7 LiteMLA blocks"):
        patch(_model(), Reduction([None] * 3), method="x")


def test_deepcopy_of_a_patched_model_is_independent_and_equal():
    model = vitbench.apply(_model(), "dcs")
    with torch.no_grad():  # masks that really drop channels, so the copy must carry them
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.out_features in (256, 512) and m.in_features in (128, 256):
                m.weight.normal_(generator=torch.Generator().manual_seed(1))
    twin = copy.deepcopy(model)
    x = _images()
    with torch.no_grad():
        assert torch.equal(twin(x), model(x))
    assert reduction_context(twin) is not reduction_context(model)
    wrappers = [m for m in twin.modules() if isinstance(m, ReducingLiteMLA)]
    assert all(w._context is reduction_context(twin) for w in wrappers)
    assert reduction_context(twin).inputs is not None and torch.equal(reduction_context(twin).inputs, x)
