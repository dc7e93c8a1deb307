"""MCTF, training-free (plugins/mctf/): hand-made oracles for each criterion of the attraction,
the bidirectional matching and the attention-weighted fusion; token counts, sizes and sources
on test_vit; r=0 equals the unpatched model; bad parameters; conformance."""
from __future__ import annotations

import copy
import math

import pytest
import timm
import torch

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.errors import ParamError
from vitbench.host import get_host
from vitbench_plugins.mctf.reduction import (
    MCTFReducer,
    Temperatures,
    attraction,
    fusion_assignment,
    fusion_slots,
    received_attention,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def _unit(angle: float) -> list[float]:
    return [math.cos(angle), math.sin(angle)]


# Four patch tokens, no prefix: A = {t0, t2} (even positions), B = {t1, t3}. The pair (t0, t1)
# is the more similar one (0.1 rad apart, against 0.3 rad for (t2, t3)); across pairs the tokens
# are nearly orthogonal.
TOKENS = torch.tensor([[_unit(0.1), _unit(0.0), _unit(math.pi / 2 - 0.3), _unit(math.pi / 2)]])
UNIFORM = torch.full((1, 4), 0.25)
ONES = torch.ones(1, 4)
SIM_ONLY = Temperatures(sim=1.0, info=0.0, size=0.0)


def _fused_pair(received=UNIFORM, size=ONES, taus=SIM_ONLY) -> list[int]:
    """Which two patch tokens end up in one token when one is fused away (r=1, A -> B)."""
    scores = attraction(TOKENS, received, size, a_start=0, taus=taus)
    assign = fusion_assignment(scores, 1, bidirectional=False, a_start=0, patches=4)[0].tolist()
    return [i for i in range(4) if assign.count(assign[i]) == 2]


def test_similarity_fuses_the_most_similar_pair():
    assert _fused_pair() == [0, 1]


def test_similarity_is_the_cosine_of_the_tokens_shifted_to_0_1():
    scores = attraction(TOKENS, UNIFORM, ONES, a_start=0, taus=SIM_ONLY)[0]
    expected = [[(math.cos(0.1) + 1) / 2, (math.cos(math.pi / 2 - 0.1) + 1) / 2],
                [(math.cos(math.pi / 2 - 0.3) + 1) / 2, (math.cos(0.3) + 1) / 2]]
    assert torch.allclose(scores, torch.tensor(expected), atol=1e-6)


def test_informativeness_fuses_the_tokens_little_attention_goes_to():
    """(t0, t1) receive most of the attention: the less similar but ignored pair (t2, t3) fuses,
    even at the default temperature tau_info=20 (the paper: uninformative tokens are fused)."""
    received = torch.tensor([[0.4, 0.4, 0.1, 0.1]])
    assert _fused_pair(received, taus=Temperatures(1.0, 1.0, 0.0)) == [2, 3]
    assert _fused_pair(received, taus=Temperatures(1.0, 20.0, 0.0)) == [2, 3]


def test_informativeness_also_picks_the_destination():
    """t0 is as similar to t1 as to t3 (the two are equal) and t2 to neither; t3 is ignored,
    so t0 fuses into t3 rather than into t1."""
    tokens = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [0.0, 1.0]]])  # t2: opposite to B
    received = torch.tensor([[0.3, 0.5, 0.15, 0.05]])
    scores = attraction(tokens, received, ONES, a_start=0, taus=Temperatures(1.0, 20.0, 0.0))
    assert fusion_assignment(scores, 1, False, 0, 4)[0].tolist() == [2, 1, 0, 2]  # t0 -> t3's slot


def test_size_keeps_large_tokens_from_growing():
    """t1 already stands for 4 patches: with the size criterion the pair (t2, t3) fuses instead;
    a very high temperature weakens the criterion until similarity decides again."""
    size = torch.tensor([[1.0, 4.0, 1.0, 1.0]])
    assert _fused_pair(size=size, taus=Temperatures(1.0, 0.0, 1.0)) == [2, 3]
    assert _fused_pair(size=size, taus=Temperatures(1.0, 0.0, 40.0)) == [2, 3]
    assert _fused_pair(size=size, taus=Temperatures(1.0, 0.0, 1000.0)) == [0, 1]


def test_criteria_multiply_with_exponent_one_over_tau():
    """Eq. 2: W = W_sim^(1/t_sim) W_info^(1/t_info) W_size^(1/t_size), with 1/a and 1/s
    normalised by their largest value in the image."""
    received = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    size = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    taus = Temperatures(2.0, 3.0, 5.0)
    got = attraction(TOKENS, received, size, a_start=0, taus=taus)[0]
    inv_a = (1 / received[0]) / (1 / received[0]).max()
    inv_s = (1 / size[0]) / (1 / size[0]).max()
    unit = TOKENS[0]
    for i, a in enumerate((0, 2)):
        for j, b in enumerate((1, 3)):
            sim = (float(unit[a] @ unit[b]) + 1) / 2
            expected = sim ** 0.5 * float(inv_a[a] * inv_a[b]) ** (1 / 3) * float(inv_s[a] * inv_s[b]) ** (1 / 5)
            assert got[i, j].item() == pytest.approx(expected, rel=1e-5)


def test_received_attention_averages_over_heads_and_queries():
    attn = torch.tensor([[[[0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]],
                          [[0.1, 0.1, 0.8], [0.3, 0.3, 0.4], [0.0, 0.0, 1.0]]]])
    expected = attn.sum(dim=(1, 2)) / 6
    assert torch.allclose(received_attention(attn), expected)
    assert received_attention(attn)[0].tolist() == pytest.approx([2.1 / 6, 1.1 / 6, 2.8 / 6])


# -- bidirectional matching on a hand-made attraction ------------------------------------------
SCORES = torch.tensor([[[0.9, 0.1, 0.2],    # a0: best b0 (0.9) -> fuses in step 1
                        [0.8, 0.3, 0.1],    # a1
                        [0.2, 0.4, 0.6]]])  # a2


def test_step_one_fuses_a_into_b_then_step_two_b_into_the_a_left():
    """r=2: a0 -> b0 (the best A edge, 0.9). Then the B tokens pick among a1, a2 by the same
    scores (columns): b0 -> a1 (0.8), b1 -> a2 (0.4), b2 -> a2 (0.6); b0's 0.8 is the best, so b0
    (holding a0) fuses into a1. Layout: a1, a2, then b1, b2."""
    slot_a, slot_b = fusion_slots(SCORES, 2, bidirectional=True)
    assert slot_a[0].tolist() == [0, 0, 1]  # a0 follows b0 into a1
    assert slot_b[0].tolist() == [0, 2, 3]


def test_without_bidirectional_all_r_go_from_a_to_b():
    """r=2 one way: a0 (0.9) and a1 (0.8) both fuse into b0. Layout: a2, then b0, b1, b2."""
    slot_a, slot_b = fusion_slots(SCORES, 2, bidirectional=False)
    assert slot_a[0].tolist() == [1, 1, 0]
    assert slot_b[0].tolist() == [1, 2, 3]


def test_r_one_bidirectional_fuses_one_b_token_into_a():
    """r=1: r // 2 = 0 A -> B, then 1 B -> A: the best B edge over all A is b0 -> a0 (0.9)."""
    slot_a, slot_b = fusion_slots(SCORES, 1, bidirectional=True)
    assert slot_a[0].tolist() == [0, 1, 2]
    assert slot_b[0].tolist() == [0, 3, 4]


def _groups_by_loops(scores: list[list[float]], r: int, bidirectional: bool) -> list[list[str]]:
    """The matching written out literally, token by token: which tokens share each output token,
    in the output order (the A tokens left, then the B tokens left)."""
    n_a, n_b = len(scores), len(scores[0])
    r1 = r // 2 if bidirectional else r
    best_b = {i: max(range(n_b), key=lambda j: scores[i][j]) for i in range(n_a)}
    fused_a = sorted(range(n_a), key=lambda i: -scores[i][best_b[i]])[:r1]
    members = {f"b{j}": [f"b{j}"] for j in range(n_b)}
    for i in fused_a:
        members[f"b{best_b[i]}"].append(f"a{i}")
    left_a = [i for i in range(n_a) if i not in fused_a]
    for i in left_a:
        members[f"a{i}"] = [f"a{i}"]
    best_a = {j: max(left_a, key=lambda i: scores[i][j]) for j in range(n_b)}
    fused_b = sorted(range(n_b), key=lambda j: -scores[best_a[j]][j])[:r - r1]
    for j in fused_b:
        members[f"a{best_a[j]}"] += members.pop(f"b{j}")
    order = [f"a{i}" for i in left_a] + [f"b{j}" for j in range(n_b) if j not in fused_b]
    return [sorted(members[name]) for name in order]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("bidirectional", [True, False])
def test_matching_equals_a_literal_loop_implementation(seed, bidirectional):
    scores = torch.rand(1, 7, 6, generator=torch.Generator().manual_seed(seed))
    for r in range(1, 7):
        slot_a, slot_b = fusion_slots(scores, r, bidirectional)
        groups: dict[int, list[str]] = {}
        for name, slots in (("a", slot_a[0]), ("b", slot_b[0])):
            for i, slot in enumerate(slots.tolist()):
                groups.setdefault(slot, []).append(f"{name}{i}")
        got = [sorted(groups[k]) for k in range(len(groups))]
        assert got == _groups_by_loops(scores[0].tolist(), r, bidirectional)
        assert len(groups) == 13 - r


# -- the reducer: attention-weighted fusion, prefix, sizes --------------------------------------
def _attn_receiving(received: list[float], heads: int = 2) -> torch.Tensor:
    """An attention matrix whose every row is ``received`` (so that is what each token receives)."""
    row = torch.tensor(received)
    n = row.shape[0]
    return row.expand(1, heads, n, n).clone()


def test_fused_token_is_the_attention_and_size_weighted_mean():
    """cls + 6 patches (a_start=1: A = positions 2, 4, 6; B = 1, 3, 5), r=2 one way, similarity
    only: the two A tokens nearest to B token 1 fuse into it. The fused token is
    sum(a s x) / sum(a s) over the three, its size their sum; cls stays first, untouched."""
    torch.manual_seed(0)
    far = torch.randn(7, 16)
    x = far.clone()
    x[2] = x[1] + 0.01 * torch.randn(16)
    x[4] = x[1] + 0.02 * torch.randn(16)
    x = x[None]
    received = [0.05, 0.3, 0.1, 0.2, 0.15, 0.1, 0.1]
    sizes = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0])
    state = TokenState.start(x, prefix=1, trace_source=True)
    state.size = sizes[None, :, None].clone()
    reducer = MCTFReducer(2, SIM_ONLY, bidirectional=False)
    out = reducer(x, state, AttnInfo(attn=_attn_receiving(received)))
    a, s = torch.tensor(received), sizes
    group = [1, 2, 4]
    w = (a * s)[group]
    expected = (w[:, None] * x[0, group]).sum(0) / w.sum()
    # layout: cls, A left (position 6), then B (1 with its group, 3, 5)
    assert out.shape == (1, 5, 16)
    assert torch.equal(out[0, 0], x[0, 0])
    assert torch.allclose(out[0, 2], expected, atol=1e-6)
    assert torch.allclose(out[0, [1, 3, 4]], x[0, [6, 3, 5]])
    assert state.size[0, :, 0].tolist() == [1.0, 1.0, 6.0, 1.0, 1.0]
    assert state.source[0, 2].tolist() == [0, 1, 1, 0, 1, 0, 0]


def test_weights_differ_from_a_plain_size_weighted_merge():
    """The same group, fused by size alone, lands elsewhere: the attention weights matter."""
    torch.manual_seed(0)
    x = torch.randn(1, 5, 8)
    x[0, 2] = x[0, 1] + 0.1
    state = TokenState.start(x, prefix=1)
    out = MCTFReducer(1, SIM_ONLY, bidirectional=False)(x, state, AttnInfo(attn=_attn_receiving([0.1, 0.6, 0.1, 0.1, 0.1])))
    plain = (x[0, 1] + x[0, 2]) / 2
    weighted = (0.6 * x[0, 1] + 0.1 * x[0, 2]) / 0.7
    fused = out[0, -2]  # layout: cls, A left (4), B (1 with 2, then 3)
    assert torch.allclose(fused, weighted, atol=1e-6) and not torch.allclose(fused, plain, atol=1e-3)


# -- the patched model ----------------------------------------------------------------------------
def _run(model, x, **params):
    reduced = vitbench.apply(copy.deepcopy(model), "mctf", **params)
    with torch.inference_mode():
        out = reduced(x)
    return out, reduction_context(reduced)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_token_counts_sizes_and_sources_on_test_vit(vit, bidirectional):
    """r=8 in each of the 6 blocks: 101 -> 93 ... 53; the sizes add up to the 100 patches, and
    every patch is covered by exactly one token."""
    x = torch.randn(2, 3, 160, 160)
    out, ctx = _run(vit, x, r=8, bidirectional=bidirectional, trace_source=True)
    assert ctx.token_counts == [93, 85, 77, 69, 61, 53]
    assert torch.equal(ctx.state.size[:, 1:].sum(dim=1), torch.full((2, 1), 100.0))
    assert torch.equal(ctx.state.source[:, 1:].sum(dim=1)[:, 1:], torch.ones(2, 100))
    assert torch.equal(ctx.state.source[:, 1:].sum(dim=-1, keepdim=True), ctx.state.size[:, 1:])
    assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()


def test_r_is_capped_at_half_the_patches(vit):
    _, ctx = _run(vit, torch.randn(1, 3, 160, 160), r=40)
    assert ctx.token_counts == [61, 31, 16, 9, 5, 3]
    assert ctx.state.size[:, 1:].sum().item() == 100.0


def test_schedules(vit):
    x = torch.randn(1, 3, 160, 160)
    assert _run(vit, x, r=[0, 10, 0, 10, 0, 5])[1].token_counts == [101, 91, 91, 81, 81, 76]
    assert _run(vit, x, r=(10, -0.5))[1].token_counts == [86, 73, 62, 53, 46, 41]  # 15, 13, 11, 9, 7, 5


def test_r0_equals_the_unpatched_model(vit):
    x = torch.randn(2, 3, 160, 160)
    with torch.inference_mode():
        expected = vit(x)
    out, ctx = _run(vit, x, r=0)
    assert torch.equal(out, expected)
    assert ctx.token_counts == [101] * 6


def test_without_prefix_tokens():
    """No class token (global average pooling): every token takes part."""
    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, class_token=False, global_pool="avg").eval()
    out, ctx = _run(model, torch.randn(2, 3, 160, 160), r=8)
    assert ctx.token_counts == [92, 84, 76, 68, 60, 52]
    assert torch.equal(ctx.state.size.sum(dim=1), torch.full((2, 1), 100.0))
    assert torch.isfinite(out).all()


def test_gradients_flow_through_the_fusion(vit):
    model = vitbench.apply(copy.deepcopy(vit), "mctf", r=8).train()
    model(torch.randn(2, 3, 160, 160)).sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0


def test_registration():
    spec = get_host().method("mctf")
    assert (spec.kind, spec.needs, spec.needs_training) == ("merging", {"token_steps", "attn"}, False)
    assert get_host().families_for(spec) == ["mobilevit", "vit"]
    assert (spec.budget.param, spec.budget.larger_means, spec.budget.per_block) == ("r", "less", True)
    defaults = spec.params()
    assert (defaults.r, defaults.tau_sim, defaults.tau_info, defaults.tau_size) == (16, 1.0, 20.0, 40.0)
    assert defaults.bidirectional and defaults.prop_attn


@pytest.mark.parametrize("bad, message", [
    (dict(r=-1), r"mctf\.r=-1 is out of range; it must be an integer >= 0"),
    (dict(r="many"), r"mctf\.r='many' is not a valid"),
    (dict(tau_info=-1.0), r"mctf\.tau_info=-1\.0 is out of range; it must be a finite number >= 0"),
    (dict(tau_sim=float("inf")), r"mctf\.tau_sim=inf is not a finite number"),
    (dict(tau_size=-0.5), r"mctf\.tau_size=-0\.5 is out of range"),
    (dict(r=[1, 2]), r"mctf\.r has 2 entries; the model has 6 blocks"),
    (dict(q=1), r"unknown parameter mctf\.q; valid parameters of mctf: r, tau_sim, tau_info, tau_size, "
                r"bidirectional, prop_attn, trace_source"),
])
def test_bad_parameters_name_the_value(vit, bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(copy.deepcopy(vit), "mctf", **bad)


@pytest.mark.parametrize("params, counts", [
    ({"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ({"r": 8, "bidirectional": False}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ({}, [49, 33, 17, 9, 5, 3, 2, 2, 2, 2, 2, 2]),  # r=16, capped from block 3 on
])
def test_conforms(vitbench_check_method, params, counts):
    report = vitbench_check_method("mctf", params)
    assert (report.token_counts, report.output_shape) == (counts, (2, 10))
