"""Zero-TPrune (plugins/zero_tprune/, docs/methods.md): the Weighted PageRank against the
stationary distribution and a hand computation (uniform and class-token starts), the I-stage and
S-stage choices on hand-made graphs and keys in both stage orders (the paper's I' -> S -> I and
I -> S), the paper's order against a loop oracle, the prefix rule, token counts, equality with
the unpatched model when off, bad parameters, and the conformance check."""
from __future__ import annotations

import copy

import pytest
import timm
import torch

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench.testing import check_method, tiny_deit_distilled, tiny_vit
from vitbench_plugins.zero_tprune import ZeroTPruneParams
from vitbench_plugins.zero_tprune.reduction import (
    ZeroTPruneReducer,
    initial_scores,
    kept_patches,
    kept_patches_s_first,
    split_budget,
    sub_graph,
    token_importance,
    weighted_page_rank,
)

pytestmark = pytest.mark.usefixtures("single_thread")


#: token 0 is the class token; token 1 is the hub everyone attends to, and it attends to token 2.
#: By the attention it receives (one WPR step, the column means) token 2 is the least important
#: patch, but the hub's attention makes it the second most important at convergence; token 3,
#: attended mostly by the unimportant token 4, is the least important patch there.
GRAPH = torch.tensor([
    [0.20, 0.60, 0.02, 0.08, 0.10],
    [0.05, 0.15, 0.70, 0.05, 0.05],
    [0.10, 0.70, 0.02, 0.08, 0.10],
    [0.05, 0.30, 0.02, 0.18, 0.45],
    [0.05, 0.30, 0.02, 0.45, 0.18],
], dtype=torch.float64)


def _stationary(a: torch.Tensor) -> torch.Tensor:
    """The stationary distribution of the row-stochastic ``a``: the eigenvector of ``a^T`` for
    the eigenvalue 1, normalised to sum 1."""
    values, vectors = torch.linalg.eig(a.T)
    v = vectors[:, (values - 1).abs().argmin()].real
    return v / v.sum()


def test_one_wpr_step_is_the_attention_each_token_receives_by_hand():
    # s_1(j) = sum_i A(i, j) / N: e.g. token 2 gets (0.02 + 0.70 + 0.02 + 0.02 + 0.02) / 5
    expected = torch.tensor([0.45, 2.05, 0.78, 0.84, 0.88], dtype=torch.float64) / 5
    assert torch.allclose(weighted_page_rank(GRAPH, 1), expected, atol=1e-12)
    # s_2(j) = sum_i s_1(i) A(i, j), token 2: the hub's 0.41 * 0.70 dominates
    s2 = weighted_page_rank(GRAPH, 2)
    assert abs(float(s2[2]) - float((expected * GRAPH[:, 2]).sum())) < 1e-12
    assert abs(float(s2[2]) - 0.2988) < 1e-12


def test_wpr_converges_to_the_stationary_distribution():
    stationary = _stationary(GRAPH)
    assert torch.allclose(weighted_page_rank(GRAPH, 30), stationary, atol=1e-6)
    assert torch.allclose(weighted_page_rank(GRAPH, 200), stationary, atol=1e-12)
    assert abs(float(weighted_page_rank(GRAPH, 30).sum()) - 1.0) < 1e-12  # stays a distribution
    # the least important patch (tokens 1-4): token 2 after one step, token 3 at convergence
    assert int(weighted_page_rank(GRAPH, 1)[1:].argmin()) + 1 == 2
    assert int(stationary[1:].argmin()) + 1 == 3


def test_eir_is_the_rms_over_heads_and_mean_is_wpr_of_the_head_mean():
    other = GRAPH.flip(0).flip(1)  # another row-stochastic graph
    attn = torch.stack([GRAPH, other])[None]  # [1, 2 heads, 5, 5]
    s1, s2 = _stationary(GRAPH), _stationary(other)
    eir = token_importance(attn, 200, "eir")[0].double()
    assert torch.allclose(eir, ((s1 ** 2 + s2 ** 2) / 2).sqrt(), atol=1e-6)
    mean = token_importance(attn, 200, "mean")[0].double()
    assert torch.allclose(mean, _stationary((GRAPH + other) / 2), atol=1e-6)
    one_head = GRAPH[None, None]
    assert torch.allclose(token_importance(one_head, 30, "eir"), token_importance(one_head, 30, "mean"))


def _reduce(x: torch.Tensor, attn: torch.Tensor, keys: torch.Tensor, prefix: int = 1, **params):
    p = ZeroTPruneParams(**params)
    reducer = ZeroTPruneReducer(p.r if isinstance(p.r, int) else p.r[0], p.i_share, p.iters, p.heads,
                                p.partition, p.init, p.order)
    state = TokenState(prefix=prefix)
    out = reducer(x, state, AttnInfo(attn=attn, keys=keys))
    return out, state


def _match(out: torch.Tensor, x: torch.Tensor) -> list[int]:
    """Which input tokens the output rows are (the tokens are distinct)."""
    return [int((x[0] == row).all(-1).nonzero()[0, 0]) for row in out[0]]


def test_i_stage_prunes_the_least_important_token_of_the_graph():
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0))
    attn, keys = GRAPH.float()[None, None], torch.randn(1, 5, 4)
    out, _ = _reduce(x, attn, keys, r=1, i_share=1.0, init="uniform", order="i_first")
    assert _match(out, x) == [0, 1, 2, 4]  # token 3 pruned; the cls token, least important, kept
    out, _ = _reduce(x, attn, keys, r=1, i_share=1.0, iters=1, init="uniform", order="i_first")
    assert _match(out, x) == [0, 1, 3, 4]  # one step only counts the attention received
    # with no S-stage the paper's order is the I-stage on the whole graph: the same choice
    out, _ = _reduce(x, attn, keys, r=1, i_share=1.0, init="uniform")
    assert _match(out, x) == [0, 1, 2, 4]


def test_i_then_s_stage_on_the_graph():
    """order=i_first, r=2 split 1 + 1: the I-stage drops token 3; the survivors by importance
    are 1, 2, 4, so (sequential) 1 and 2 are targets and 4 the only source, which the S-stage
    drops."""
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0))
    out, _ = _reduce(x, GRAPH.float()[None, None], torch.randn(1, 5, 4), r=2, i_share=0.5,
                     init="uniform", order="i_first")
    assert _match(out, x) == [0, 1, 2]


# -- the paper's initialisation and stage order (I' -> S -> I) ----------------------------------
def test_cls_start_is_sqrt_n_times_the_others():
    s = initial_scores(5, "cls")
    assert torch.allclose(s, torch.tensor([5 ** 0.5, 1, 1, 1, 1]) / (4 + 5 ** 0.5))
    assert torch.allclose(initial_scores(4, "uniform"), torch.full((4,), 0.25))


def test_one_wpr_step_from_the_cls_start_by_hand():
    """s_1(j) = (sqrt(5) A(0, j) + sum_{i>=1} A(i, j)) / (4 + sqrt(5)); the column sums of
    GRAPH without row 0 are 0.25, 1.45, 0.76, 0.76, 0.78. From this start one step ranks token
    2 last among the patches (0.805 against 0.939 for token 3)."""
    rest = torch.tensor([0.25, 1.45, 0.76, 0.76, 0.78], dtype=torch.float64)
    expected = (5 ** 0.5 * GRAPH[0] + rest) / (4 + 5 ** 0.5)
    got = token_importance(GRAPH[None, None], 1, "eir", "cls")[0]
    assert torch.allclose(got.double(), expected, atol=1e-6)
    assert int(got[1:].argmin()) + 1 == 2
    # converged, the start does not matter (the chain is irreducible and aperiodic)
    assert torch.allclose(token_importance(GRAPH[None, None], 200, "eir", "cls"),
                          token_importance(GRAPH[None, None], 200, "eir", "uniform"), atol=1e-6)


def test_sub_graph_renormalises_the_kept_rows_by_hand():
    sub = sub_graph(GRAPH[None, None], torch.tensor([[0, 1, 3, 4]]))[0, 0]
    assert torch.allclose(sub[1], torch.tensor([1 / 6, 1 / 2, 1 / 6, 1 / 6], dtype=torch.float64))
    assert torch.allclose(sub[0], torch.tensor([0.20, 0.60, 0.08, 0.10], dtype=torch.float64) / 0.98)
    assert torch.allclose(sub.sum(-1), torch.ones(4, dtype=torch.float64))


def test_s_first_order_on_the_graph_by_hand():
    """order=s_first (the paper's I' -> S -> I), r=2 split 1 + 1, cls start. I': one step
    ranks the patches 1 (2.79), 4 (1.00), 3 (0.94), 2 (0.80) (numerators of s_1 above), so
    targets {1, 4}, sources {3, 2}; the key of 2 duplicates the key of target 4, so the S-stage
    drops 2. I-stage on the graph of {0, 1, 3, 4}: token 3 is its least important patch. The
    I -> S order keeps 2 and drops 4 instead."""
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0))
    keys = torch.eye(5)[None].clone()
    keys[0, 2] = keys[0, 4]
    attn = GRAPH.float()[None, None]
    stationary = _stationary(sub_graph(GRAPH[None, None], torch.tensor([[0, 1, 3, 4]]))[0, 0])
    assert int(stationary[1:].argmin()) == 1  # token 3 of {0, 1, 3, 4}
    out, _ = _reduce(x, attn, keys, r=2, i_share=0.5)
    assert _match(out, x) == [0, 1, 4]
    out, _ = _reduce(x, attn, keys, r=2, i_share=0.5, order="i_first")
    assert _match(out, x) == [0, 1, 2]


def _oracle_s_first(attn, keys, prefix, r_i, r_s, iters, init, partition):
    """The paper's order for one image, written out in float64 with Python lists."""
    a, k = attn.double(), torch.nn.functional.normalize(keys.double(), dim=-1)
    n = a.shape[-1]

    def scores(graph, steps):  # EIR of the per-head WPR from the start vector
        m = graph.shape[-1]
        s0 = torch.ones(m, dtype=torch.float64)
        if init == "cls":
            s0[0] = m ** 0.5
        s0 = s0 / s0.sum()
        per_head = []
        for g in graph:
            s = s0.clone()
            for _ in range(steps):
                s = g.T @ s
            per_head.append(s)
        return torch.stack(per_head).pow(2).mean(0).sqrt()

    patches = list(range(prefix, n))
    pre = scores(a, 1)
    ranked = sorted(patches, key=lambda t: (-float(pre[t]), t))
    half = (len(ranked) + 1) // 2
    if partition == "sequential":
        targets, sources = ranked[:half], ranked[half:]
    else:
        targets, sources = ranked[0::2], ranked[1::2]
    best = {t: max(float(k[t] @ k[u]) for u in targets) for t in sources}
    dropped = sorted(sources, key=lambda t: (-best[t], sources.index(t)))[:r_s]
    kept = [t for t in patches if t not in dropped]
    if r_i:
        tokens = list(range(prefix)) + kept
        sub = a[:, tokens][:, :, tokens]
        sub = sub / sub.sum(-1, keepdim=True)
        imp = scores(sub, iters)
        order = sorted(range(prefix, len(tokens)), key=lambda j: (-float(imp[j]), j))
        kept = sorted(tokens[j] for j in order[: len(kept) - r_i])
    return [t - prefix for t in kept]


@pytest.mark.parametrize("prefix, r_i, r_s, init, partition", [
    (1, 2, 3, "cls", "sequential"), (2, 3, 2, "uniform", "sequential"), (1, 0, 4, "cls", "alternate"),
    (1, 4, 0, "cls", "sequential"), (0, 2, 2, "uniform", "alternate"),
])
def test_s_first_equals_a_loop_oracle(prefix, r_i, r_s, init, partition):
    g = torch.Generator().manual_seed(7)
    b, h, n = 3, 3, 13
    attn = torch.softmax(3 * torch.randn(b, h, n, n, generator=g, dtype=torch.float64), dim=-1)
    keys = torch.randn(b, n, 6, generator=g, dtype=torch.float64)
    got = kept_patches_s_first(attn, keys, prefix, r_i, r_s, 5, "eir", init, partition)
    for i in range(b):
        assert got[i].tolist() == _oracle_s_first(attn[i], keys[i], prefix, r_i, r_s, 5, init, partition)


def _uniform(n: int) -> torch.Tensor:
    return torch.full((1, 1, n, n), 1.0 / n)


def test_s_stage_prunes_a_duplicate_token():
    """Uniform attention: equal importance, so the order is by position (stable); with
    sequential partition patches 0-2 are targets and 3-5 sources. Patch 4 duplicates patch 1
    (same value, same key): it is the source most similar to a target and goes."""
    g = torch.Generator().manual_seed(1)
    x, keys = torch.randn(1, 7, 8, generator=g), torch.randn(1, 7, 4, generator=g)
    x[0, 5], keys[0, 5] = x[0, 2], keys[0, 2]
    out, state = _reduce(x, _uniform(7), keys, r=1, i_share=0.0)
    assert out.shape[1] == 6 and torch.equal(out[0, :5], x[0, :5]) and torch.equal(out[0, 5], x[0, 6])
    assert state.size is None  # pruning: sizes stay ones


def test_kept_patches_by_partition():
    importance = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10]])
    keys = torch.eye(5)[None].clone()
    keys[0, 4] = keys[0, 0]  # the least important patch duplicates the most important
    # sequential: targets {0, 1, 2}, sources {3, 4}; source 4 matches target 0 exactly
    assert kept_patches(importance, keys, 0, 1, "sequential").tolist() == [[0, 1, 2, 3]]
    # alternate: targets {0, 2, 4}, sources {1, 3}; make source 3 a copy of target 2
    keys = torch.eye(5)[None].clone()
    keys[0, 3] = keys[0, 2] + 0.01
    assert kept_patches(importance, keys, 0, 1, "alternate").tolist() == [[0, 1, 2, 4]]
    # I-stage 1 (drops patch 4) then S-stage 1 among 4 survivors: sources {2, 3}, 3 matches 2
    assert kept_patches(importance, keys, 1, 1, "sequential").tolist() == [[0, 1, 2]]
    assert kept_patches(importance, keys, 2, 0).tolist() == [[0, 1, 2]]


def test_prefix_tokens_are_never_pruned():
    """Two prefix tokens that receive no attention (least important) and whose keys duplicate
    patches stay first and unchanged, whatever the split."""
    n, prefix = 8, 2
    attn = torch.rand(1, 2, n, n, generator=torch.Generator().manual_seed(2))
    attn[..., :prefix] = 0.0
    attn = attn / attn.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(3)
    x, keys = torch.randn(2, n, 8, generator=g), torch.randn(2, n, 4, generator=g)
    keys[:, 0], keys[:, 1] = keys[:, 2], keys[:, 3]
    for share in (0.0, 0.5, 1.0):
        out, _ = _reduce(x, attn.expand(2, -1, -1, -1), keys, prefix=prefix, r=3, i_share=share)
        assert out.shape[1] == n - 3 and torch.equal(out[:, :prefix], x[:, :prefix])


def test_split_budget():
    assert split_budget(11, 0.5) == (6, 5)
    assert split_budget(10, 0.5) == (5, 5)
    assert split_budget(7, 0.0) == (0, 7)
    assert split_budget(7, 1.0) == (7, 0)
    assert split_budget(1, 0.5) == (1, 0)


# -- on models --------------------------------------------------------------------------------
def _test_vit():
    torch.manual_seed(0)
    return timm.create_model("test_vit", pretrained=False).eval()  # 160x160: 100 patches + cls, 6 blocks


def _counts(model, method: str, **params) -> list[int]:
    reduced = vitbench.apply(copy.deepcopy(model), method, **params)
    with torch.inference_mode():
        out = reduced(torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(0)))
    assert torch.isfinite(out).all()
    return reduction_context(reduced).token_counts


def test_token_counts_on_test_vit():
    model = _test_vit()
    assert _counts(model, "zero-tprune") == [90, 79, 68, 57, 46, 35]  # r=11 per block
    # capped at (N - 1) // 2 per block, as ToMe: 101 -> 71 -> 41 -> 21 -> 11 -> 6 -> 4
    assert _counts(model, "zero-tprune", r=30) == [71, 41, 21, 11, 6, 4] == _counts(model, "tome", r=30)
    assert _counts(model, "zero-tprune", r=20, layers=(1, 3)) == [101, 81, 81, 61, 61, 61]
    assert _counts(model, "zero-tprune", r=[0, 5, 0, 5, 10, 0]) == [101, 96, 96, 91, 81, 81]


@pytest.mark.parametrize("params", [
    {"heads": "mean"}, {"partition": "alternate"}, {"i_share": 0.0}, {"i_share": 1.0}, {"iters": 1},
    {"order": "i_first"}, {"init": "uniform"}, {"order": "i_first", "init": "uniform"},
])
def test_variants_are_finite_and_remove_r(params):
    assert _counts(_test_vit(), "zero-tprune", **params) == [90, 79, 68, 57, 46, 35]


@pytest.mark.parametrize("factory", [_test_vit, tiny_deit_distilled])
def test_switched_off_equals_the_unpatched_model(factory):
    model = factory()
    size = model.patch_embed.img_size
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = model(x)
        got = vitbench.apply(copy.deepcopy(model), "zero-tprune", r=0)(x)
    assert (got - expected).abs().max() < 1e-5


def test_gradients_flow_through_the_kept_tokens():
    model = vitbench.apply(_test_vit(), "zero-tprune").train()
    x = torch.randn(2, 3, 160, 160, requires_grad=True)
    model(x).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_only_the_pruning_blocks_give_up_the_fused_kernel():
    model = vitbench.apply(_test_vit(), "zero-tprune", layers=(1, 4))
    assert [blk.fused for blk in model.blocks] == [True, False, True, True, False, True]


@pytest.mark.parametrize("kwargs, message", [
    ({"r": -1}, r"zero-tprune.r=-1 is out of range; it must be >= 0"),
    ({"r": [1, -2]}, r"zero-tprune.r=\[1, -2\] is out of range"),
    ({"i_share": 1.5}, r"zero-tprune.i_share=1.5 is out of range; it must be in \[0, 1\]"),
    ({"iters": 0}, r"zero-tprune.iters=0 is out of range; it must be >= 1"),
    ({"heads": "max"}, r"zero-tprune.heads='max'; valid values: eir, mean"),
    ({"partition": "random"}, r"zero-tprune.partition='random'; valid values: sequential, alternate"),
    ({"layers": (-1,)}, r"zero-tprune.layers=\[-1\] is out of range; every item must be >= 0"),
    ({"init": "zeros"}, r"zero-tprune.init='zeros'; valid values: cls, uniform"),
    ({"order": "is"}, r"zero-tprune.order='is'; valid values: s_first, i_first"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("zero-tprune", ZeroTPruneParams, kwargs)  # what the command line, the plan and apply go through


@pytest.mark.parametrize("kwargs, message", [
    ({"layers": (7,)}, r"zero-tprune.layers contains 7; valid block indices for this model: 0..5"),
    ({"r": [1, 2]}, r"zero-tprune.r has 2 entries; the model has 6 blocks"),
])
def test_bad_parameters_for_the_model(kwargs, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(_test_vit(), "zero-tprune", **kwargs)


def test_conforms():
    report = check_method("zero-tprune", {"r": 8})
    assert report.token_counts == [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]  # as ToMe at r=8
    report = check_method("zero-tprune", {"r": 16, "layers": (3, 6, 9), "partition": "alternate"})
    assert report.token_counts == [65] * 3 + [49] * 3 + [33] * 3 + [17] * 3
