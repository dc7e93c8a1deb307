"""Last-layer fusion in the engine: tokens pruned aside by ``TokenState.keep(stash=True)`` rejoin at
their positions through ``TokenState.restore`` (with sizes, sources and gradients), a forward that
stashes refuses merges, a restoring reducer passes the token rules up to the first count and no
further, and the families that cannot take tokens back refuse it."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.models.swin_transformer import SwinTransformer

from vitbench.core.contract import Reduction
from vitbench.engine import AttnInfo, Reducer, TokenState, reduction_context
from vitbench_plugins.vit_family import adapter as vit
from vitbench.engine.matching import bipartite_soft_matching
from vitbench.engine.token_rules import check_token_rules
from vitbench.errors import TokenRuleError, UnsupportedError
from vitbench.host import get_host
from vitbench.testing import tiny_vit

#: one small model of each family that reduces after the attention or on tiles
OTHER_FAMILIES = {
    "swin": lambda: SwinTransformer(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                                    num_classes=10),
    "mobilevit": lambda: timm.create_model("mobilevit_xs", pretrained=False, num_classes=10),
    "efficientvit": lambda: timm.create_model("efficientvit_b1", pretrained=False, num_classes=10),
}


def test_stash_then_restore_brings_every_token_back_at_its_position():
    x = torch.randn(2, 6, 4, requires_grad=True)
    state = TokenState.start(x, prefix=1, trace_source=True)
    kept = state.keep(x, torch.tensor([[0, 4, 2, 5, 1], [0, 3, 1, 2, 5]]), stash=True)
    kept = state.keep(kept * 2, torch.tensor([[0, 3, 1], [0, 1, 4]]), stash=True)
    assert len(state.stashed) == 2 and state.origin.tolist() == [[0, 5, 4], [0, 3, 5]]
    out = state.restore(kept)
    expected = x.detach() * 2  # all but the tokens the first step set aside went through the doubling
    expected[0, 3], expected[1, 4] = x[0, 3].detach(), x[1, 4].detach()
    assert torch.equal(out, expected)
    assert torch.equal(state.source, torch.eye(6).expand(2, 6, 6))  # every position its own token again
    assert state.origin is None and state.stashed == []
    out.sum().backward()  # the stashed tokens kept their gradients
    assert torch.equal(x.grad, torch.where(expected == x.detach(), 1.0, 2.0))


def test_restore_without_stashed_tokens_returns_the_tokens():
    x = torch.randn(1, 5, 3)
    state = TokenState.start(x, prefix=1)
    assert state.restore(x) is x


def test_a_merge_while_tokens_are_stashed_is_refused():
    x = torch.randn(1, 7, 4)
    state = TokenState.start(x, prefix=1)
    kept = state.keep(x, torch.tensor([[0, 1, 2, 3, 4]]), stash=True)
    with pytest.raises(ValueError, match=r"a forward that stashes tokens cannot also merge them"):
        state.merge(kept, bipartite_soft_matching(kept, 1, 1))


def test_tokens_are_set_aside_from_the_first_reduction_on():
    x = torch.randn(1, 7, 4)
    state = TokenState.start(x, prefix=1)
    kept = state.keep(x, torch.tensor([[0, 1, 2, 3, 4]]))
    with pytest.raises(ValueError, match=r"5 tokens, not the 7 the forward started with"):
        state.keep(kept, torch.tensor([[0, 1, 2]]), stash=True)


class _KeepFirstAside(Reducer):
    """Keep the first ``k`` tokens before the block's attention, the others set aside."""

    before_attention = True

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        return state.keep(x, torch.arange(self.k).expand(x.shape[0], self.k), stash=True)


class _Restore(Reducer):
    """Bring the set-aside tokens back (and ``extra`` copies of the last, to break the rule)."""

    before_attention = True
    restores = True

    def __init__(self, extra: int = 0) -> None:
        self.extra = extra

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        x = state.restore(x)
        return torch.cat([x] + [x[:, -1:]] * self.extra, dim=1)


def test_a_restoring_reducer_gives_the_last_block_every_token():
    """Blocks 1-10 run on the first 20 tokens; block 11 on all 65, those set aside after block 0
    taken as block 0 left them (a plain forward written out by hand)."""
    base = tiny_vit()
    reducers = [None, _KeepFirstAside(20)] + [None] * 9 + [_Restore()]
    model = vit.patch(copy.deepcopy(base), Reduction(reducers), method="fusion")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        first = base.blocks[0](base.norm_pre(base._pos_embed(base.patch_embed(x))))
        tokens = first[:, :20]
        for blk in base.blocks[1:11]:
            tokens = blk(tokens)
        tokens = base.blocks[11](torch.cat([tokens, first[:, 20:]], dim=1))
        expected = base.forward_head(base.norm(tokens))
        assert torch.allclose(model(x), expected, atol=1e-5)
        assert reduction_context(model).token_counts == [65] + [20] * 10 + [65]
        check_token_rules(model, x, "fusion")  # restoring up to the first count keeps the rules


def test_a_restoring_step_may_not_grow_beyond_the_first_count():
    reducers = [None, _KeepFirstAside(20)] + [None] * 9 + [_Restore(extra=1)]
    model = vit.patch(tiny_vit(), Reduction(reducers), method="overfused")
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(TokenRuleError, match=r"token rule broken by overfused at block 11: the sequence grew from "
                                             r"20 to 66 tokens, beyond the 65 the forward started with"):
        check_token_rules(model, x)


@pytest.mark.parametrize("family", ["swin", "mobilevit", "efficientvit"])
def test_families_that_cannot_take_tokens_back_refuse_a_restoring_reducer(family: str) -> None:
    base = OTHER_FAMILIES[family]().eval()
    spec = get_host().family(family)

    class Late(_Restore):
        before_attention = False  # so that the families reducing after the attention get as far

    with pytest.raises(UnsupportedError, match=r"^restore needs restores(, token_steps)?, which this model family "
                                               r"does not provide \(it provides "):
        spec.patch(base, Reduction([Late()] * spec.describe(base).depth), method="restore")
