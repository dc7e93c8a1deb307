"""DTEM (plugins/dtem/): ToMe's merge on a learned decoupled embedding; soft merging in training."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.measure.calibrate import TOLERANCE
from vitbench.engine import bipartite_soft_matching, reduction_context
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench.host import get_host
from vitbench.testing import check_method, tiny_vit
from vitbench_plugins.dtem import DTEMParams
from vitbench_plugins.dtem.reduction import DTEMReducer, soft_top_r

pytestmark = pytest.mark.usefixtures("single_thread")

COUNTS_R8 = [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]  # tiny_vit (64 patches, 12 blocks): ToMe's
IMAGES = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(0))  # test_vit's size


def _reducers(model):
    return [m for m in model.modules() if isinstance(m, DTEMReducer)]


def _logits_and_counts(model, x=IMAGES):
    with torch.no_grad():
        logits = model(x)
    return logits, reduction_context(model).token_counts


def test_registers_as_a_learnable_merging_method():
    spec = get_host().method("dtem")
    assert spec.kind == "merging" and spec.needs_training and get_host().families_for(spec) == ["vit"]
    assert spec.budget.param == "r" and spec.budget.larger_means == "less" and spec.budget.per_block
    model = vitbench.apply(tiny_vit(), "dtem", r=4)
    reducers = _reducers(model)
    assert len(reducers) == 12 and all(r.needs == {"input", "keys"} for r in reducers)
    assert all(b.fused for b in model.blocks)  # no attention probabilities asked for
    assert reducers[0].embed.out_features == 16  # the head width (48 / 3 heads)
    assert not any(r.training for r in reducers)
    assert vitbench.apply(tiny_vit(), "dtem", init="random")  # needs only the input
    assert _reducers(vitbench.apply(tiny_vit(), "dtem", init="random"))[0].needs == {"input"}


@pytest.mark.parametrize("kwargs, message", [
    ({"r": -1}, r"dtem.r=-1 is out of range; r must be an integer >= 0"),
    ({"r": "(4,)"}, r"dtem.r='\(4,\)' is not a valid "),  # parentheses: a schedule, never a list
    ({"feat_dim": 0}, r"dtem.feat_dim=0 is out of range; it must be >= 1"),
    ({"init": "zeros"}, r"dtem.init='zeros'; valid values: keys, random"),
    ({"k2": 0}, r"dtem.k2=0 is out of range; it must be >= 1"),
    ({"tau1": 0.0}, r"dtem.tau1=0.0 is out of range; it must be > 0 \(the temperature\)"),
    ({"tau2": -1.0}, r"dtem.tau2=-1.0 is out of range; it must be > 0 \(the temperature\)"),
    ({"epochs": 0}, r"dtem.epochs=0 is out of range; it must be >= 1"),
    ({"lr": 0.0}, r"dtem.lr=0.0 is out of range; it must be > 0"),
    ({"weight_decay": -1.0}, r"dtem.weight_decay=-1.0 is out of range; it must be >= 0"),
    ({"batch_size": 0}, r"dtem.batch_size=0 is out of range; it must be >= 1"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("dtem", DTEMParams, kwargs)  # what the command line, the plan and apply go through


@pytest.mark.parametrize("kwargs, message", [
    ({"r": [2, 2]}, r"dtem.r has 2 entries; the model has 12 blocks"),
    ({"feat_dim": 8}, r"dtem.feat_dim=8 is out of range for init='keys'; it must be >= the head width 16"),
])
def test_settings_the_model_cannot_take_name_its_range(kwargs, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "dtem", **kwargs)


def test_untrained_keys_init_is_tome_exactly(vit):
    """The embedding is an offset from the head-averaged keys, zero before training: ToMe."""
    for r in (16, [0, 8, 16, 4, 30, 2]):
        dtem, dtem_counts = _logits_and_counts(vitbench.apply(copy.deepcopy(vit), "dtem", r=r))
        tome, tome_counts = _logits_and_counts(vitbench.apply(copy.deepcopy(vit), "tome", r=r))
        assert torch.equal(dtem, tome) and dtem_counts == tome_counts
    assert tome_counts == [101, 93, 77, 73, 43, 41]


def test_an_embedding_equal_to_the_key_projection_merges_as_tome(vit):
    """``init=random`` with its linear map set to the head average of the key projection is the
    keys (up to float rounding): the same merges, the same counts, the same outputs."""
    model = vitbench.apply(copy.deepcopy(vit), "dtem", init="random", r=16)
    for block, reducer in zip(model.blocks, _reducers(model)):
        qkv = block.block.attn.qkv if hasattr(block, "block") else block.attn.qkv
        c, h = vit.embed_dim, vit.blocks[0].attn.num_heads
        w_k = qkv.weight[c:2 * c].reshape(h, c // h, c).mean(dim=0)
        b_k = qkv.bias[c:2 * c].reshape(h, c // h).mean(dim=0)
        with torch.no_grad():
            reducer.embed.weight.copy_(w_k)
            reducer.embed.bias.copy_(b_k)
    dtem, dtem_counts = _logits_and_counts(model)
    tome, tome_counts = _logits_and_counts(vitbench.apply(copy.deepcopy(vit), "tome", r=16))
    assert dtem_counts == tome_counts == [85, 69, 53, 37, 21, 11]
    assert torch.allclose(dtem, tome, atol=1e-5)


def test_counts_follow_the_schedule_and_training_removes_nothing(vit):
    model = vitbench.apply(copy.deepcopy(vit), "dtem", r=16)
    assert _logits_and_counts(model)[1] == [85, 69, 53, 37, 21, 11]
    model.train()
    alive = []
    for reducer in _reducers(model):
        reducer.register_forward_hook(lambda m, args, out: alive.append(
            (out.shape[1], args[1].private["dtem_alive"], float(args[1].size.sum(dim=1).mean()))))
    model(IMAGES)
    assert [a[0] for a in alive] == [101] * 6  # training keeps every token ...
    assert [a[1] for a in alive] == [85, 69, 53, 37, 21, 11]  # ... and shrinks the matched part
    assert all(a[2] == pytest.approx(101.0, abs=1e-3) for a in alive)  # sizes only move


def test_soft_grouping_tends_to_tomes_hard_choice():
    """Cold temperatures, one candidate per A token: the soft top-r picks ToMe's r edges."""
    g = torch.Generator().manual_seed(0)
    metric = torch.randn(2, 1 + 20, 8, generator=g)
    unit = metric[:, 1:] / metric[:, 1:].norm(dim=-1, keepdim=True)
    scores = unit[:, 0::2] @ unit[:, 1::2].transpose(-1, -2)
    assign = soft_top_r(scores, r=4, k2=1, tau1=1.0, tau2=1e-5)
    hard = torch.zeros_like(scores)
    best, dst = scores.max(dim=-1)
    src = best.argsort(dim=-1, descending=True)[:, :4]
    for b in range(2):
        hard[b, src[b], dst[b, src[b]]] = 1.0
    assert torch.allclose(assign, hard, atol=1e-3)
    # warm: every row gives away at most all of itself, the total is about r
    warm = soft_top_r(scores, r=4, k2=3, tau1=0.1, tau2=0.1)
    assert (warm >= 0).all() and (warm.sum(dim=-1) <= 1 + 1e-5).all()
    assert torch.allclose(warm.sum(dim=(1, 2)), torch.full((2,), 4.0), atol=0.5)
    # the matching ToMe makes at inference from the same metric (prefix 0 here: the A set is even positions)
    m = bipartite_soft_matching(metric[:, 1:], 4, 0)
    assert torch.equal(m.src_idx.sort(dim=-1).values, src.sort(dim=-1).values)


def test_gradients_reach_only_the_embeddings():
    model = vitbench.apply(tiny_vit(), "dtem", r=4, init="random")
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for r in _reducers(model) for p in r.embed.parameters()]
    for p in params:
        p.requires_grad_(True)
    model.train()
    model(torch.randn(2, 3, 32, 32)).logsumexp(-1).sum().backward()
    grads = [p.grad for p in params]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_conforms():
    assert check_method("dtem", {"r": 8}).token_counts == COUNTS_R8


def test_matched_compute_sets_r(calibrated_on_tiny_vit):
    result = calibrated_on_tiny_vit("dtem", 0.6)
    assert result.param == "r"
    assert abs(result.calibrated_gmacs / (0.6 * result.baseline_gmacs) - 1) <= TOLERANCE


def test_fine_tunes_through_the_run_path(fine_tuned_run):
    """A short fine-tuning on test_vit through ``vitbench run``: finite numbers, fewer GMACs."""
    fine_tuned_run("dtem", "dtem.r=8")
