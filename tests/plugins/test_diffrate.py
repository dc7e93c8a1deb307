"""DiffRate (plugins/diffrate/): prune then merge by class attention to given per-block kept
counts (``diffrate``), and the search of those counts (``diffrate-search``)."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import AttnInfo, TokenState, enable_source_tracing, reduction_context
from vitbench.errors import ParamError, UnsupportedError
from vitbench.measure import count_gmacs
from vitbench.host import get_host
from vitbench.testing import check_method, check_prefix_tokens, tiny_deit_distilled, tiny_vit, tiny_vit_registers
from vitbench_plugins.diffrate.reduction import (
    DiffRateReducer,
    DiffRateSearchReducer,
    default_schedule,
    prune_then_merge,
    search_cost,
    searched_kept,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def _sharp_vit():
    """tiny_vit with sharper attention (qkv x6): a random tiny_vit attends almost uniformly."""
    model = tiny_vit()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(6.0)
    return model


def _images(n=2, seed=0, size=32):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# -- the rule on hand-made tensors ---------------------------------------------------------------

# one image, the class token then six patches; importance (the class row averaged over two
# heads) 0.125, 0.375, 0.0625, 0.25, 0.3125, 0.125: sorted, patches 1, 4, 3, 0, 5, 2 (0 and 5
# tie: the lower position first). Each head alone ranks otherwise (top four: head 0 3, 0, 5, 1;
# head 1 1, 4, 3, 5). Dyadic values, so the head mean is exact and the tie stays a tie.
_MEAN = torch.tensor([0.125, 0.375, 0.0625, 0.25, 0.3125, 0.125])
_SPREAD = torch.tensor([0.09375, -0.25, 0.03125, 0.125, -0.1875, 0.03125])
_KEYS = torch.tensor([[0.0, 0.0],  # class token (never used)
                      [0.0, 1.0], [1.0, 0.0], [-1.0, -1.0], [1.0, 0.1], [0.1, 1.0], [-1.0, 0.5]])


def _hand_info() -> AttnInfo:
    cls_row = torch.cat([torch.zeros(1), _MEAN])
    spread = torch.cat([torch.zeros(1), _SPREAD])
    return AttnInfo(keys=_KEYS[None], cls_attn=torch.stack([cls_row + spread, cls_row - spread])[None])


def _hand_tokens() -> torch.Tensor:
    return torch.arange(7 * 3, dtype=torch.float32).reshape(1, 7, 3)


def test_pruning_removes_exactly_the_least_important_patches():
    x = _hand_tokens()
    state = TokenState.start(x, prefix=1)
    out = DiffRateReducer(prune_kept=4, merge_kept=4)(x, state, _hand_info())
    # kept: patches 1, 4, 3, 0 (the tie 0/5 goes to the lower position); pruned: 2 and 5;
    # the prefix first, the kept patches in their original order
    assert torch.equal(out, x[:, [0, 1, 2, 4, 5]])


def test_merging_merges_the_least_important_kept_into_their_most_similar():
    x = _hand_tokens()
    state = TokenState.start(x, prefix=1, trace_source=True)
    state.size = torch.tensor([1.0, 1.0, 2.0, 1.0, 3.0, 1.0, 1.0]).reshape(1, 7, 1)
    out = DiffRateReducer(prune_kept=4, merge_kept=2)(x, state, _hand_info())
    # pruning keeps 1, 4, 3, 0; merging keeps the two most important, 1 and 4; patch 3 (key
    # (1, 0.1)) merges into 1 (key (1, 0)), patch 0 (key (0, 1)) into 4 (key (0.1, 1));
    # size-weighted: patch 1 stands for 2 patches, patch 3 for 3
    t = x[0]
    expected = torch.stack([t[0], (2 * t[2] + 3 * t[4]) / 5, (t[5] + t[1]) / 2])[None]
    assert torch.allclose(out, expected)
    assert state.size.flatten().tolist() == [1.0, 5.0, 2.0]
    covers = (state.source[0] > 0).int()
    assert covers[1].nonzero().flatten().tolist() == [2, 4] and covers[2].nonzero().flatten().tolist() == [1, 5]
    assert covers[0].nonzero().flatten().tolist() == [0]
    # the pruned patches 2 and 5 (tokens 3 and 6) left their last value for unmerge
    assert torch.equal(state.fill[0, 3], t[3]) and torch.equal(state.fill[0, 6], t[6])


def test_merging_alone_and_nothing_to_do():
    x = _hand_tokens()
    state = TokenState.start(x, prefix=1)
    out = prune_then_merge(x, state, _KEYS[None], _MEAN[None], prune_kept=6, merge_kept=5)
    # only patch 2 (the least important) merges, into the most similar of the others by its key
    # (-1, -1): cosine with patch 5 (-1, 0.5) is the largest
    t = x[0]
    assert torch.allclose(out, torch.stack([t[0], t[1], t[2], t[4], t[5], (t[3] + t[6]) / 2])[None])
    state = TokenState.start(x, prefix=1)
    assert prune_then_merge(x, state, _KEYS[None], _MEAN[None], 9, 9) is x and state.size is None


# -- on a model ---------------------------------------------------------------------------------


def test_counts_follow_the_lists_exactly(vit):
    x = torch.randn(2, 3, 160, 160)
    prune_kept, merge_kept = (90, 80, 80, 50, 50, 20), (85, 80, 60, 50, 30, 20)
    reduced = vitbench.apply(copy.deepcopy(vit), "diffrate", prune_kept=prune_kept, merge_kept=merge_kept)
    enable_source_tracing(reduced)
    with torch.inference_mode():
        out = reduced(x)
    ctx = reduction_context(reduced)
    assert ctx.token_counts == [86, 81, 61, 51, 31, 21]
    assert out.shape == (2, 1000) and torch.isfinite(out).all()
    # every token stands for the patches it covers, each patch covered at most once (a pruned
    # token takes the patches merged into it along)
    size, covers = ctx.state.size[..., 0], (ctx.state.source > 0).float()
    assert torch.equal(covers.sum(dim=-1), size) and covers.sum(dim=1).max() == 1
    assert (size[:, 1:] >= 1).all() and (size[:, 1:].sum(dim=1) <= 100 - 35).all()  # 35 tokens pruned


@pytest.mark.parametrize("params", [dict(prune_kept=(90, 70, 70, 40, 40, 10)),
                                    dict(merge_kept=(90, 70, 70, 40, 40, 10))])
def test_one_list_alone(vit, params):
    """Only ``prune_kept``: pruning alone (no token stands for more than one patch); only
    ``merge_kept``: merging alone (the kept tokens still stand for all 100 patches)."""
    reduced = vitbench.apply(copy.deepcopy(vit), "diffrate", **params)
    with torch.inference_mode():
        reduced(torch.randn(2, 3, 160, 160))
    ctx = reduction_context(reduced)
    assert ctx.token_counts == [91, 71, 71, 41, 41, 11]
    if "prune_kept" in params:
        assert ctx.state.size is None
    else:
        assert ctx.state.size[:, 1:].sum(dim=1).flatten().tolist() == [100.0, 100.0]


@pytest.mark.parametrize("params", [dict(keep=1.0), dict(prune_kept=(100,) * 6, merge_kept=(100,) * 6)])
def test_no_pruning_and_no_merging_is_the_unpatched_model(vit, params):
    x = torch.randn(2, 3, 160, 160)
    reduced = vitbench.apply(copy.deepcopy(vit), "diffrate", **params)
    with torch.inference_mode():
        assert torch.equal(reduced(x), vit(x))
    assert reduction_context(reduced).token_counts == [101] * 6


def test_default_schedule_by_hand():
    # 100 patches, 6 blocks, keep 0.3: 30 left after block 5, 70 removed evenly (11.67 a block):
    # after each block 88, 77, 65, 53, 42, 30; half of each block's removals merge
    prune_kept, merge_kept = default_schedule(100, 6, 0.3, 0.5)
    assert merge_kept == [88, 77, 65, 53, 42, 30]
    assert prune_kept == [94, 83, 71, 59, 48, 36]  # 12 removed: 6 pruned, 6 merged; 11: 5 + 6 (half up)
    assert default_schedule(100, 6, 0.3, 0.0)[0] == merge_kept  # all pruned
    assert default_schedule(100, 6, 0.3, 1.0)[0] == [100, 88, 77, 65, 53, 42]  # all merged
    assert default_schedule(100, 6, 1.0, 0.5) == ([100] * 6, [100] * 6)
    assert default_schedule(196, 12, 0.0001, 0.5)[1][-1] == 1  # at least one patch


def test_the_knob_is_monotone_in_gmacs():
    gmacs = [count_gmacs(vitbench.apply(tiny_vit(), "diffrate", keep=k), _images(1)).mean
             for k in (0.1, 0.4, 0.7, 1.0)]
    assert gmacs == sorted(gmacs) and gmacs[0] < gmacs[-1]


def test_a_model_without_class_token_is_refused():
    model = tiny_vit(class_token=False, global_pool="avg")
    with pytest.raises(UnsupportedError, match="no class token"):
        vitbench.apply(model, "diffrate")


@pytest.mark.parametrize("params, message", [
    (dict(keep=0.0), r"diffrate.keep=0.0 is out of range; it must be in \(0, 1\]"),
    (dict(keep=1.5), r"diffrate.keep=1.5 is out of range"),
    (dict(merge_share=-0.1), r"diffrate.merge_share=-0.1 is out of range; it must be in \[0, 1\]"),
    (dict(merge_share=1.1), r"diffrate.merge_share=1.1 is out of range"),
    (dict(prune_kept=(50, 60, 40, 40, 30, 20)), r"diffrate.prune_kept\[1\]=60 is out of range; it must be <= "
                                                r"prune_kept\[0\]=50"),
    (dict(merge_kept=(50, 40, 40, 40, 45, 20)), r"diffrate.merge_kept\[4\]=45 is out of range"),
    (dict(prune_kept=(50, 40), merge_kept=(60, 30)), r"diffrate.merge_kept\[0\]=60 is out of range; it must be "
                                                     r"<= prune_kept\[0\]=50"),
    (dict(prune_kept=(50, 45), merge_kept=(40, 30)), r"diffrate.prune_kept\[1\]=45 is out of range; it must be "
                                                     r"<= merge_kept\[0\]=40"),
    (dict(prune_kept=(50, 40), merge_kept=(40,)), r"prune_kept has 2 entries and diffrate.merge_kept 1"),
    (dict(prune_kept=(50, 0)), r"diffrate.prune_kept=\[50, 0\] is out of range; every count must be an integer >= 1"),
    (dict(merge_kept=()), r"diffrate.merge_kept=\(\) is out of range"),
])
def test_bad_parameters(params, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "diffrate", **params)


@pytest.mark.parametrize("params, message", [
    (dict(prune_kept=(60,) * 11), r"diffrate.prune_kept has 11 entries; the model has 12 blocks"),
    (dict(merge_kept=(65,) * 12), r"diffrate.merge_kept\[0\]=65 is out of range; the model has 64 patch tokens"),
])
def test_lists_that_do_not_fit_the_model(params, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "diffrate", **params)


@pytest.mark.parametrize("params, counts", [
    ({}, [61, 57, 54, 50, 46, 42, 39, 35, 31, 27, 24, 20]),  # keep 0.3: 19 patches left
    (dict(prune_kept=(60, 60, 50, 40) + (30,) * 8, merge_kept=(60, 50, 50, 30) + (30,) * 8), [61, 51, 51] + [31] * 9),
])
def test_conforms(params, counts):
    report = check_method("diffrate", params)
    assert report.token_counts == counts and report.output_shape == (2, 10)


def test_registration():
    host = get_host()
    spec = host.method("diffrate")
    assert (spec.kind, spec.needs_training, spec.needs) == ("hybrid", False, {"token_steps", "cls_attn"})
    assert (spec.budget.param, spec.budget.larger_means, spec.budget.mode) == ("keep", "more", "search")
    search = host.method("diffrate-search")
    assert (search.kind, search.needs_training) == ("hybrid", True)
    assert (search.budget.param, search.budget.mode) == ("gmacs_fraction", "fraction")
    stage = reduction_context(vitbench.apply(tiny_vit(), "diffrate-search")).reduction.train[0]
    assert (stage.optimizer, stage.lr, stage.epochs) == ("Adam", 0.05, 1)
    assert (stage.batch_size, stage.label_smoothing) == (64, 0.0)


# -- the search ---------------------------------------------------------------------------------


def _search_reducers(model):
    return sorted((m for m in model.modules() if isinstance(m, DiffRateSearchReducer)), key=lambda m: m.index)


def _one_hot_rate(logits, tokens, kept):
    """Put (almost) all of ``logits``' distribution on the rate that keeps ``kept`` of ``tokens``."""
    k_all = logits.shape[0]
    k = next(k for k in range(k_all) if math.ceil(tokens * (1 - k / k_all) - 1e-3) == kept)
    logits.fill_(-30.0)[k] = 30.0


def _set_counts(model, prune_kept, merge_kept):
    """Rates that make the blocks keep exactly these counts."""
    reducers = _search_reducers(model)
    incoming = reducers[0].num_patches
    with torch.no_grad():
        for r, kp, km in zip(reducers, prune_kept, merge_kept):
            _one_hot_rate(r.prune_logits, incoming, kp)
            _one_hot_rate(r.merge_logits, kp, km)
            incoming = km
    return model


def _stage(model):
    return reduction_context(model).reduction.train[0]


_PRUNE = (60, 50, 50, 40, 40, 40, 30, 30, 20, 20, 20, 10)
_MERGE = (55, 50, 45, 40, 40, 35, 30, 25, 20, 20, 15, 10)
_TOKENS = [56, 51, 46, 41, 41, 36, 31, 26, 21, 21, 16, 11]


def test_search_starts_from_the_unpatched_model():
    """Untrained, every block puts 0.99 on the rate 0: expected rates 0.005, which remove no
    token (``ceil(64 * 0.995) = 64``)."""
    report = check_method("diffrate-search", reduces_tokens=False)
    assert report.token_counts == [65] * 12
    model = vitbench.apply(tiny_vit(), "diffrate-search")
    x = _images(2)
    with torch.inference_mode():
        assert torch.equal(model(x), tiny_vit()(x))


@pytest.mark.parametrize("factory", [tiny_vit, tiny_deit_distilled, tiny_vit_registers])
def test_searched_rates_keep_the_prefix_first(factory):
    model = _set_counts(vitbench.apply(factory(), "diffrate-search"), _PRUNE, _MERGE)
    with torch.inference_mode():
        check_prefix_tokens(model, _images(2))
    prefix = reduction_context(model).prefix
    assert reduction_context(model).token_counts == [t + prefix - 1 for t in _TOKENS]


@pytest.mark.parametrize("factory", [_sharp_vit, tiny_deit_distilled])
def test_training_masks_exactly_the_tokens_inference_removes(factory):
    model = _set_counts(vitbench.apply(factory(), "diffrate-search"), _PRUNE, _MERGE)
    x = _images(3)
    with torch.no_grad():
        expected = model(x)
    ctx = reduction_context(model)
    assert ctx.token_counts == [t + ctx.prefix - 1 for t in _TOKENS]
    model.train()
    with torch.no_grad():
        logits = model(x)
    mask = ctx.state.private["diffrate_mask"]
    assert ctx.token_counts == [64 + ctx.prefix] * 12  # masked, not removed
    assert (mask.sum(dim=1) == _TOKENS[-1] + ctx.prefix - 1).all()
    assert torch.allclose(logits, expected, atol=1e-4)


def test_searched_counts_are_diffrate_with_those_lists():
    model = _set_counts(vitbench.apply(_sharp_vit(), "diffrate-search"), _PRUNE, _MERGE)
    assert searched_kept(model) == (_PRUNE, _MERGE)
    plain = vitbench.apply(_sharp_vit(), "diffrate", prune_kept=_PRUNE, merge_kept=_MERGE)
    x = _images(2)
    with torch.inference_mode():
        assert torch.equal(model(x), plain(x))


def test_gradients_reach_both_distributions_and_the_backbone_is_untouched():
    model = vitbench.apply(_sharp_vit(), "diffrate-search").train()
    labels = torch.tensor([0, 1])
    logits = model(_images(2))
    penalty = _stage(model).extra_loss(model, logits, labels)
    (F.cross_entropy(logits, labels) + penalty).backward()
    reducers = _search_reducers(model)
    assert all(r.prune_logits.grad.abs().sum() > 0 for r in reducers)
    assert sum(float(r.merge_logits.grad.abs().sum()) for r in reducers) > 0
    assert _stage(model).trainable == ("prune_logits", "merge_logits")


def test_cost_model_is_the_counted_gmacs():
    base = _sharp_vit()
    info = get_host().family_of(base).describe(base)
    model = _set_counts(vitbench.apply(_sharp_vit(), "diffrate-search"), _PRUNE, _MERGE)
    cost = search_cost(model, info)
    assert cost.full == pytest.approx(count_gmacs(base, _images(1)).mean * 1e9, rel=1e-12)
    assert cost.macs(list(zip(_PRUNE, _MERGE))) / 1e9 == pytest.approx(count_gmacs(model, _images(1)).mean, rel=1e-12)


def test_penalty_measures_the_counted_ratio_and_is_absent_at_inference():
    model = _set_counts(vitbench.apply(_sharp_vit(), "diffrate-search", gmacs_fraction=0.5), _PRUNE, _MERGE)
    x, labels = _images(2), torch.tensor([0, 1])
    with torch.inference_mode():
        counted = count_gmacs(model, x[:1]).mean / count_gmacs(_sharp_vit(), x[:1]).mean
        logits = model(x)
    assert _stage(model).extra_loss(model, logits, labels) is None
    model.train()
    logits = model(x)
    penalty = _stage(model).extra_loss(model, logits, labels)
    ratio = reduction_context(model).extras["diffrate_gmacs_ratio"]
    assert float(ratio) == pytest.approx(counted, rel=1e-6)
    assert penalty.item() == pytest.approx(10.0 * (counted - 0.5) ** 2, rel=1e-5)


def test_the_penalty_alone_moves_the_counts_towards_the_fraction():
    """Untrained the model runs at 1.002 x the GMACs (nothing removed; the class-attention rows
    cost a little); Adam on the penalty alone takes it most of the way to 0.8 in 15 steps."""
    model = vitbench.apply(_sharp_vit(), "diffrate-search", gmacs_fraction=0.8, lambda_flops=1.0).train()
    params = [p for r in _search_reducers(model) for p in (r.prune_logits, r.merge_logits)]
    opt = torch.optim.Adam(params, lr=0.1)
    x, labels = _images(2), torch.tensor([0, 1])
    ratios = []
    for _ in range(15):
        logits = model(x)
        penalty = _stage(model).extra_loss(model, logits, labels)
        ratios.append(float(reduction_context(model).extras["diffrate_gmacs_ratio"]))
        opt.zero_grad()
        penalty.backward()
        opt.step()
    assert ratios[0] > 1.0 and ratios[8] < 0.85 and abs(ratios[-1] - 0.8) < 0.12


@pytest.mark.parametrize("params, message", [
    (dict(gmacs_fraction=0.0), r"diffrate-search.gmacs_fraction=0.0 is out of range; it must be in \(0, 1\] \(the fraction"),
    (dict(lambda_flops=-1.0), r"diffrate-search.lambda_flops=-1.0 is out of range"),
    (dict(epochs=0), r"diffrate-search.epochs=0 is out of range"),
    (dict(lr=0.0), r"diffrate-search.lr=0.0 is out of range"),
    (dict(optimizer="LBFGS"), r"valid values: SGD, AdamW, Adam"),
    (dict(batch_size=0), r"diffrate-search.batch_size=0 is out of range"),
    (dict(label_smoothing=1.0), r"diffrate-search.label_smoothing=1.0 is out of range"),
])
def test_search_bad_parameters(params, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "diffrate-search", **params)


def test_search_state_dict_round_trips():
    model = _set_counts(vitbench.apply(tiny_vit(), "diffrate-search"), _PRUNE, _MERGE)
    fresh = vitbench.apply(tiny_vit(seed=1), "diffrate-search")
    fresh.load_state_dict(copy.deepcopy(model.state_dict()), strict=True)
    assert searched_kept(fresh) == (_PRUNE, _MERGE)


def test_the_fine_tuning_loop_trains_only_the_rate_distributions():
    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.finetune import finetune

    model = tiny_vit(in_chans=1)
    model.pretrained_cfg = {"input_size": (1, 32, 32), "mean": (0.2190,), "std": (0.3318,),
                            "crop_pct": 1.0, "interpolation": "bilinear"}
    data = resolve_cls_data("fashion-mnist", model)
    model = vitbench.apply(model, "diffrate-search", batch_size=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = finetune(model, data, limit=64)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(before[k], v)}
    assert changed and all(k.endswith(("reducer.prune_logits", "reducer.merge_logits")) for k in changed)
    assert result.stages[0]["iters"] == 2 and "last_extra" in result.stages[0]
    assert not model.training
