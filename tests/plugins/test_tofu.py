"""ToFu (plugins/tofu/): merge-by-prune in the first blocks, MLERP later. Hand-made oracles
for both rules, ToMe's token counts, equality with the unpatched model at r=0, conformance, and
bad parameters."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.engine import AttnInfo, Reducer, TokenState, bipartite_soft_matching, reduction_context
from vitbench.errors import ParamError
from vitbench.testing import tiny_vit
from vitbench_plugins.tofu import ToFuParams
from vitbench_plugins.tofu.reduction import ToFuReducer, block_schedule, mlerp

pytestmark = pytest.mark.usefixtures("single_thread")


# -- a hand-made block: cls + 6 patches -------------------------------------------------------
# ToMe's split counts absolute positions: set A = tokens 2, 4, 6 (even), set B = tokens 1, 3, 5.
# Keys: token 2 ~ token 1 (cosine 1), token 6 ~ token 5 (cosine 0.894), token 4 like no B token
# (cosine 0). With r=2, tokens 2 -> 1 and 6 -> 5 are matched; token 4 stays.
# Layout after the block: [0, 4, 1, 3, 5] (prefix, unmatched A, then B).
E = torch.eye(4)
KEYS = torch.stack([E[3], E[0], E[0], E[1], E[2], E[3] + 0.5 * E[1], E[3]])[None]
X = torch.tensor([[9.0, 9, 9, 9],     # 0 cls
                  [0.0, 4, 0, 0],     # 1 (B) <- 2
                  [3.0, 0, 0, 0],     # 2 (A) -> 1
                  [0.0, 0, 0, 5],     # 3 (B), receives nothing
                  [1.0, 1, 1, 1],     # 4 (A), unmatched
                  [0.0, 0, 1, 0],     # 5 (B) <- 6, size 1
                  [2.0, 0, 0, 0]])[None]  # 6 (A) -> 5, size 3
SIZES = torch.tensor([1.0, 1, 1, 1, 1, 1, 3])[None, :, None]


def _run_block(fusion: str, sizes: torch.Tensor = SIZES) -> tuple[torch.Tensor, TokenState]:
    state = TokenState(prefix=1, size=sizes.clone())
    out = ToFuReducer(2, fusion)(X.clone(), state, AttnInfo(keys=KEYS))
    return out, state


def test_the_hand_made_matching_is_as_designed():
    m = bipartite_soft_matching(KEYS, 2, prefix=1)
    assert m.src_idx.tolist() == [[0, 2]] and m.dst_idx.tolist() == [[0, 2]] and m.unm_idx.tolist() == [[1]]


def test_a_prune_block_keeps_each_destination_exactly_and_adds_sizes():
    out, state = _run_block("prune")
    expected = X[:, [0, 4, 1, 3, 5]]  # prefix, unmatched A (token 4), then B (1, 3, 5) unchanged
    assert torch.equal(out, expected)
    assert state.size[0, :, 0].tolist() == [1, 1, 2, 1, 4]  # 1+1 into token 1, 3+1 into token 5


def test_a_merge_block_gives_the_average_direction_at_the_largest_member_norm():
    out, state = _run_block("mlerp")
    assert state.size[0, :, 0].tolist() == [1, 1, 2, 1, 4]
    # tokens 2 (3,0,0,0) and 1 (0,4,0,0), sizes 1 and 1: average (1.5, 2) has norm 2.5; the
    # largest member norm is 4, so MLERP is (1.5, 2) * 4 / 2.5 = (2.4, 3.2)
    assert torch.allclose(out[0, 2], torch.tensor([2.4, 3.2, 0, 0]), atol=1e-6)
    # tokens 6 (2,0,0,0) size 3 and 5 (0,0,1,0) size 1: direction of (6, 0, 1, 0) / 4, norm 2
    merged = out[0, 4]
    assert torch.allclose(merged.norm(), torch.tensor(2.0), atol=1e-6)
    direction = torch.tensor([6.0, 0, 1, 0])
    assert torch.allclose(merged / merged.norm(), direction / direction.norm(), atol=1e-6)
    # the class token, the unmatched A token and the B token that took nothing are unchanged
    assert torch.equal(out[0, [0, 1, 3]], X[0, [0, 4, 3]])


def test_the_fused_norm_is_the_largest_members_when_the_destination_is_the_smaller_token():
    """MLERP divides the *average* by its own norm (the paper's formula). Here the destination
    (token 1, norm 1) is smaller than its source (token 2, norm 3): the average (1.5, 0.5) is
    rescaled to norm 3, giving (9, 3) / sqrt(10). Dividing by the destination's own norm
    instead (what two public re-implementations do) would give (4.5, 1.5), of norm 4.74 > 3."""
    x = X.clone()
    x[0, 1] = torch.tensor([0.0, 1, 0, 0])
    state = TokenState(prefix=1, size=torch.ones(1, 7, 1))
    out = ToFuReducer(2, "mlerp")(x, state, AttnInfo(keys=KEYS))
    expected = torch.tensor([9.0, 3.0, 0, 0]) / 10 ** 0.5
    assert torch.allclose(out[0, 2], expected, atol=1e-6)
    assert torch.isclose(out[0, 2].norm(), torch.tensor(3.0))


def test_plain_averaging_would_shrink_the_norm_that_mlerp_keeps():
    out, _ = _run_block("mlerp")
    average = (X[0, 1] + X[0, 2]) / 2
    assert average.norm() == 2.5 and torch.isclose(out[0, 2].norm(), torch.tensor(4.0))


def test_mlerp_of_identical_tokens_is_that_token():
    token = torch.tensor([0.3, -1.2, 2.0, 0.7])
    group = token.expand(5, 4)
    assert torch.allclose(mlerp(group), token, atol=1e-6)
    assert torch.allclose(mlerp(group, torch.tensor([[1.0], [4], [2], [1], [7]])), token, atol=1e-6)


def test_mlerp_of_cancelling_tokens_stays_finite():
    group = torch.tensor([[1.0, 2.0], [-1.0, -2.0]])
    assert torch.equal(mlerp(group), torch.zeros(2))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reducer_is_mlerp_of_every_matched_group(seed):
    """Random tokens, sizes and 2-d keys (so several A tokens share a partner): every output
    token equals :func:`mlerp` of its group, computed group by group from the matching."""
    g = torch.Generator().manual_seed(seed)
    b, n, c, prefix, r = 2, 21, 6, 1, 8
    x = torch.randn(b, n, c, generator=g)
    keys = torch.randn(b, n, 2, generator=g)
    sizes = torch.randint(1, 5, (b, n, 1), generator=g).float()
    state = TokenState(prefix=prefix, size=sizes.clone())
    out = ToFuReducer(r, "mlerp")(x, state, AttnInfo(keys=keys))
    m = bipartite_soft_matching(keys, r, prefix)
    a_pos = torch.arange(prefix, n)[m.a_start::2]
    b_pos = torch.arange(prefix, n)[1 - m.a_start::2]
    shared = 0
    for i in range(b):
        first_b = prefix + m.unm_idx.shape[1]
        for j, dst in enumerate(b_pos.tolist()):
            pairs = zip(m.src_idx[i].tolist(), m.dst_idx[i].tolist())
            members = [dst] + [int(a_pos[src]) for src, d in pairs if d == j]
            shared += len(members) > 2
            expected = mlerp(x[i, members], sizes[i, members]) if len(members) > 1 else x[i, dst]
            assert torch.allclose(out[i, first_b + j], expected, atol=1e-5)
            assert state.size[i, first_b + j, 0] == sizes[i, members].sum()
    assert shared > 0  # the check did cover groups of three and more


# -- whole models -------------------------------------------------------------------------


def _counts(model, images, **params):
    reduced = vitbench.apply(copy.deepcopy(model), "tofu", **params)
    with torch.inference_mode():
        out = reduced(images)
    return reduced, out


def test_r0_equals_the_unpatched_model(vit):
    x = torch.randn(2, 3, 160, 160)
    reduced, out = _counts(vit, x, r=0)
    with torch.inference_mode():
        assert torch.equal(out, vit(x))


@pytest.mark.parametrize("overrides", [dict(reg_tokens=2), dict(class_token=False, global_pool="avg")])
def test_r0_equals_the_unpatched_model_with_other_prefixes(overrides):
    model = tiny_vit(depth=4, **overrides)
    x = torch.randn(2, 3, 32, 32)
    _, out = _counts(model, x, r=0, prune_layers=2)
    with torch.inference_mode():
        assert (out - model(x)).abs().max() < 1e-5


def test_tome_token_counts_on_deit_small(deit_small):
    reduced, out = _counts(deit_small, torch.randn(1, 3, 224, 224), r=16)
    assert reduction_context(reduced).token_counts == [181, 165, 149, 133, 117, 101, 85, 69, 53, 37, 21, 11]
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("prune_layers", [0, 3, 6])
def test_token_counts_and_sizes_on_test_vit(vit, prune_layers):
    """test_vit: 101 tokens, 6 blocks; r=8 removes 8 per block whatever the fusion, and the
    sizes of the patch tokens still add up to the 100 patches."""
    reduced, out = _counts(vit, torch.randn(2, 3, 160, 160), r=8, prune_layers=prune_layers)
    ctx = reduction_context(reduced)
    assert ctx.token_counts == [93, 85, 77, 69, 61, 53]
    assert torch.equal(ctx.state.size[:, 1:].sum(dim=1), torch.full((2, 1), 100.0))
    assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()


def test_the_first_prune_block_keeps_tome_tokens_sizes_and_sources(vit):
    """Block 0 sees the same input under ToMe and ToFu, so the same tokens are matched: ToFu's
    sizes and sources equal ToMe's, and every kept token is one of the block's input tokens."""
    x = torch.randn(1, 3, 160, 160)
    schedule = [8, 0, 0, 0, 0, 0]
    tofu = vitbench.apply(copy.deepcopy(vit), "tofu", r=schedule, trace_source=True)
    tome = vitbench.apply(copy.deepcopy(vit), "tome", r=schedule, trace_source=True)
    with torch.inference_mode():
        tofu(x), tome(x)
    s_fu, s_me = reduction_context(tofu).state, reduction_context(tome).state
    assert torch.equal(s_fu.size, s_me.size) and torch.equal(s_fu.source, s_me.source)
    assert torch.equal(s_fu.source.sum(-1, keepdim=True), s_fu.size)


def test_kept_tokens_are_input_tokens_in_a_prune_block(vit):
    captured = {}
    reduced = vitbench.apply(copy.deepcopy(vit), "tofu", r=[8, 0, 0, 0, 0, 0])
    block = reduced.blocks[0]
    reducer = block.reducer

    class Spy(Reducer):
        def __call__(self, x, state, info):
            captured["in"] = x.clone()
            captured["out"] = reducer(x, state, info)
            return captured["out"]

    block.reducer = Spy()
    with torch.inference_mode():
        reduced(torch.randn(1, 3, 160, 160))
    out, inp = captured["out"][0], captured["in"][0]
    assert out.shape == (93, inp.shape[1])
    assert (out[:, None] == inp[None]).all(-1).any(-1).all()  # each output is an input, bit for bit


def test_schedule_forms_and_boundary():
    params = ToFuParams(r=(10, -0.5), prune_layers=2)
    assert block_schedule(params, 4) == [(15, "prune"), (11, "prune"), (8, "mlerp"), (5, "mlerp")]
    assert [f for _, f in block_schedule(ToFuParams(prune_layers=0), 3)] == ["mlerp"] * 3
    assert [f for _, f in block_schedule(ToFuParams(prune_layers=3), 3)] == ["prune"] * 3


@pytest.mark.parametrize("depth, prune", [(12, 6), (24, 12), (6, 3), (4, 2), (1, 0)])
def test_the_default_boundary_is_half_the_blocks(depth, prune):
    """The paper's rule "prune if l < d, else MLERP" with its ablation's d = 6 for the 12-block
    ViT-B; the default prune_layers=None generalises it to d = depth // 2."""
    fusions = [f for _, f in block_schedule(ToFuParams(), depth)]
    assert fusions == ["prune"] * prune + ["mlerp"] * (depth - prune)


def test_the_default_boundary_on_a_patched_model():
    model = vitbench.apply(tiny_vit(depth=4), "tofu", r=4)
    assert [block.reducer.fusion for block in model.blocks] == ["prune", "prune", "mlerp", "mlerp"]
    model = vitbench.apply(tiny_vit(depth=4), "tofu", r=4, prune_layers="none")  # as the CLI writes it
    assert [block.reducer.fusion for block in model.blocks] == ["prune", "prune", "mlerp", "mlerp"]
    model = vitbench.apply(tiny_vit(depth=4), "tofu", r=4, prune_layers="1")
    assert [block.reducer.fusion for block in model.blocks] == ["prune", "mlerp", "mlerp", "mlerp"]


def test_gradients_flow_through_both_fusions():
    model = vitbench.apply(tiny_vit(depth=4), "tofu", r=8, prune_layers=2).train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0


def test_a_sequence_too_short_to_match_is_left_alone():
    x = torch.randn(2, 1, 8)
    state = TokenState.start(x, prefix=0)
    assert ToFuReducer(4, "mlerp")(x, state, AttnInfo(keys=torch.randn(2, 1, 8))) is x
    assert state.size is None


@pytest.mark.parametrize("bad, message", [
    (dict(r=-3), r"tofu.r=-3 is out of range; it must be an integer >= 0"),
    (dict(r=[4, -1, 4, 4]), r"tofu.r=\[4, -1, 4, 4\] is out of range"),
    (dict(r="many"), r"tofu.r='many' is not a valid"),
    (dict(prune_layers=-1), r"tofu.prune_layers=-1 is out of range; it must be an integer >= 0"),
    (dict(prune_layers=5), r"tofu.prune_layers=5 is out of range; it must be in 0..4 for this model's 4 blocks"),
    (dict(r=[1, 2]), r"tofu.r has 2 entries; the model has 4 blocks"),
    (dict(q=1), r"unknown parameter tofu.q; valid parameters of tofu: r, prune_layers, prop_attn, trace_source"),
])
def test_bad_parameters_name_the_value(bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(depth=4), "tofu", **bad)


def test_tofu_conforms(vitbench_check_method):
    report = vitbench_check_method("tofu", {"r": 8})
    assert report.token_counts == [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]  # ToMe's counts at r=8
    assert report.output_shape == (2, 10)


def test_tofu_is_registered_as_a_hybrid_with_a_budget_knob():
    from vitbench.host import get_host

    spec = get_host().method("tofu")
    assert spec.kind == "hybrid" and spec.budget.param == "r" and spec.budget.per_block
    assert spec.needs == {"token_steps"} and not spec.needs_training
