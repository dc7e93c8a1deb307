"""Cropr's last-layer fusion (``cropr.fusion``): the modules stop two blocks before the end, the
pruned tokens rejoin at their positions before the last block (against a forward written out by
hand), counts and GMACs follow, training keeps one auxiliary loss a module, and a dense task's
map is the last block's tokens on the whole grid, no position filled from before its pruning.
Also ``cropr.aux=patches``: one query per patch, trained on each patch's class."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.measure import count_gmacs
from vitbench.tasks.dense.backbone import FeatureMaps
from vitbench.testing import check_method, tiny_vit
from vitbench_plugins.cropr.reduction import CroprReducer, FusionReducer, module_rates

pytestmark = pytest.mark.usefixtures("single_thread")


def _images(n: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_the_modules_stop_two_blocks_before_the_end_and_the_last_block_fuses():
    assert module_rates(8, 12, fusion=True) == [0, 9] + [8] * 9 + [0]
    assert module_rates(0, 12, fusion=True) == [0] * 12 and module_rates(8, 2, fusion=True) == [0, 0]
    model = vitbench.apply(tiny_vit(), "cropr", fusion=True)
    reducers = [b.reducer for b in model.blocks]
    assert reducers[0] is None and isinstance(reducers[-1], FusionReducer)
    assert [r.rate for r in reducers[1:-1]] == [9] + [8] * 9 and all(r.stash for r in reducers[1:-1])


def test_token_counts_come_back_to_every_token_in_the_last_block():
    model = vitbench.apply(tiny_vit(), "cropr", rate=3, fusion=True)
    with torch.inference_mode():
        model(_images())
    assert reduction_context(model).token_counts == [65, 61, 58, 55, 52, 49, 46, 43, 40, 37, 34, 65]


def test_the_fused_forward_is_the_papers_written_out():
    """Each module keeps the best-scored patches (score order) of the block before's output and
    sets the others aside; the last block runs on all of them, back in their first order."""
    base = tiny_vit()
    model = vitbench.apply(copy.deepcopy(base), "cropr", rate=5, fusion=True)
    modules = [b.reducer.selection for b in model.blocks[1:-1]]
    x = _images()
    with torch.inference_mode():
        tokens = base.norm_pre(base._pos_embed(base.patch_embed(x)))
        position = torch.arange(tokens.shape[1]).expand(2, -1)
        aside, aside_at = [], []
        for i, blk in enumerate(base.blocks[:-1]):
            tokens = blk(tokens)
            if i >= len(modules):
                break
            r = 6 if i == 0 else 5
            order = modules[i].scores(tokens)[:, 1:].argsort(dim=1, descending=True) + 1
            keep = torch.cat([torch.zeros(2, 1, dtype=torch.long), order[:, :order.shape[1] - r]], dim=1)
            drop = order[:, order.shape[1] - r:]
            aside.append(tokens.gather(1, drop[..., None].expand(-1, -1, tokens.shape[-1])))
            aside_at.append(position.gather(1, drop))
            tokens, position = tokens.gather(1, keep[..., None].expand(-1, -1, tokens.shape[-1])), position.gather(1, keep)
        everything = torch.cat([tokens] + aside, dim=1)
        back = torch.cat([position] + aside_at, dim=1).argsort(dim=1)
        tokens = base.blocks[-1](everything.gather(1, back[..., None].expand(-1, -1, everything.shape[-1])))
        expected = base.forward_head(base.norm(tokens))
        assert torch.allclose(model(x), expected, atol=1e-5)


def test_rate_zero_with_fusion_is_the_unpatched_model():
    base = tiny_vit()
    model = vitbench.apply(copy.deepcopy(base), "cropr", rate=0, fusion=True)
    with torch.inference_mode():
        assert torch.equal(model(_images()), base(_images()))


def test_conforms():
    report = check_method("cropr", {"fusion": True})
    assert report.token_counts == [65, 56, 48, 40, 32, 24, 16, 8, 2, 2, 2, 65]


def test_fusion_costs_the_last_block_on_every_token():
    x = torch.randn(1, 3, 32, 32)
    base = count_gmacs(tiny_vit(), x).mean
    plain = count_gmacs(vitbench.apply(tiny_vit(), "cropr", rate=3), x).mean
    fused = count_gmacs(vitbench.apply(tiny_vit(), "cropr", rate=3, fusion=True), x).mean
    assert plain < fused < base


def test_training_keeps_one_auxiliary_loss_a_module():
    model = vitbench.apply(tiny_vit(), "cropr", rate=4, fusion=True)
    model.train()
    model(_images(4))
    ctx = reduction_context(model)
    assert len(ctx.state.private["cropr_aux"]) == 10  # modules after blocks 0..9 of 12
    assert ctx.token_counts[-1] == 65 and ctx.state.stashed == []


def test_a_dense_map_is_the_last_blocks_tokens_on_the_whole_grid():
    """With fusion every position holds the token the last block computed for it (no position
    takes the value it had when it was pruned)."""
    model = vitbench.apply(tiny_vit(), "cropr", rate=4, fusion=True)
    maps = FeatureMaps(model, strides=(16,))
    last = {}
    model.norm.register_forward_hook(lambda mod, args, out: last.setdefault("tokens", out))
    with torch.inference_mode():
        maps._vit_map(_images())
    state = reduction_context(model).state
    assert torch.equal(state.source, torch.eye(65).expand(2, 65, 65))
    with torch.inference_mode():
        fmap = maps._vit_map(_images())
    patches = last["tokens"][:, 1:]
    assert torch.equal(fmap, patches.transpose(1, 2).reshape(2, -1, 8, 8))
    assert not any(isinstance(b.reducer, CroprReducer) and not b.reducer.stash for b in model.blocks[1:-1])


def test_patch_heads_have_one_query_per_patch_and_predict_the_background_too():
    model = vitbench.apply(tiny_vit(), "cropr", rate=4, aux="patches")
    module = model.blocks[1].reducer.selection
    assert module.queries.shape[1] == 64 and module.head[1].out_features == 11
    model.train()
    model(_images(2))
    ctx = reduction_context(model)
    labels = torch.randint(0, 11, (2, 64), generator=torch.Generator().manual_seed(0))
    ctx.patch_labels = labels
    aux = ctx.state.private["cropr_aux"]
    assert all(a.shape == (2, 64, 11) for a in aux)
    loss = ctx.reduction.train[0].extra_loss(model, None, torch.zeros(2, dtype=torch.long))
    expected = sum(F.cross_entropy(a.reshape(-1, 11), labels.reshape(-1), label_smoothing=0.1) for a in aux)
    assert torch.allclose(loss, expected)


def test_patch_heads_without_patch_labels_say_where_they_come_from():
    model = vitbench.apply(tiny_vit(), "cropr", aux="patches")
    model.train()
    model(_images(2))
    with pytest.raises(ParamError, match=r"cropr.aux=patches trains each module on the classes of the patches, "
                                         r"which the det and seg tasks give on a plain ViT; on cls use cropr.aux=class"):
        reduction_context(model).reduction.train[0].extra_loss(model, None, torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("params, message", [
    ({"aux": "pixels"}, r"cropr.aux"),
    ({"aux": "patches", "queries": 4}, r"cropr.queries=4 with cropr.aux=patches: that mode has one query per patch "
                                       r"\(64 here\); leave cropr.queries at 1"),
])
def test_bad_auxiliary_settings_name_the_value(params, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "cropr", **params)
