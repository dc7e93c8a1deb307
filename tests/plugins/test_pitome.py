"""PiToMe (plugins/pitome/): the energy function on hand-computed values, the energy-ordered
split on hand-made token sets (isolated tokens protected, merges inside the cluster), token
counts on test_vit, equality with the unpatched model at r=0, logits against a plain per-image
reference built from the paper's description, sizes and sources, and bad parameters."""
from __future__ import annotations

import copy
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.errors import ParamError
from vitbench.testing import check_method
from vitbench.testing.reference_tome import plain_merging_forward
from vitbench_plugins.pitome import PiToMeParams
from vitbench_plugins.pitome.reduction import (
    PiToMeReducer,
    build,
    energy_function,
    energy_matching,
    energy_scores,
    margin_schedule,
    ratio_schedule,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def _images(n: int = 2, size: int = 160) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


# -- the energy score ------------------------------------------------------------------------
#: keys (1,0), (1,0), (0.6,0.8), (0,1): cosines  row 0/1: 1, 1, .6, 0;  row 2: .6, .6, 1, .8;
#: row 3: 0, 0, .8, 1
FOUR = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]])


def test_energy_matches_hand_computed_values():
    """m = 0.7, alpha = 1. Below the margin f(x) = exp(x - 0.7) - 1: f(.6) = -0.09516258,
    f(0) = -0.50341470. Above it the paper's f(x) = x: f(1) = 1, f(.8) = .8.
    E_0 = E_1 = (1 + 1 - .09516258 - .50341470) / 4 = 0.35035568,
    E_2 = (-.09516258 * 2 + 1 + .8) / 4 = 0.40241871,
    E_3 = (-.50341470 * 2 + .8 + 1) / 4 = 0.19829265."""
    got = energy_scores(FOUR, margin=0.7, alpha=1.0)
    assert torch.allclose(got, torch.tensor([[0.35035568, 0.35035568, 0.40241871, 0.19829265]]), atol=1e-6)


def test_elu_energy_subtracts_the_margin_above_it():
    """The official code's ELU(x - m): f(1) = .3, f(.8) = .1 above the margin; each token has two
    cosines >= .7, so every energy is the paper's minus 2 * 0.7 / 4 = 0.35."""
    got = energy_scores(FOUR, margin=0.7, alpha=1.0, energy="elu")
    assert torch.allclose(got, torch.tensor([[0.00035568, 0.00035568, 0.05241871, -0.15170735]]), atol=1e-6)


def test_alpha_scales_only_the_part_below_the_margin():
    """alpha = 0.5: E_3 = (0.5 * -.50341470 * 2 + .8 + 1) / 4 = 0.32414633; f(1) stays 1."""
    assert abs(float(energy_scores(FOUR, 0.7, 0.5)[0, 3]) - 0.32414633) < 1e-6
    sims = torch.tensor([1.0, 0.7, 0.69, -1.0])
    expected = [1.0, 0.7, 0.5 * math.expm1(-0.01), 0.5 * math.expm1(-1.7)]
    assert torch.allclose(energy_function(sims, 0.7, 0.5), torch.tensor(expected), atol=1e-7)


def test_the_four_token_split_by_energy():
    """Energies rank 2, 0, 1, 3 (0 before 1 on the tie: lower position first). r = 1: the two
    highest, 2 and 0, are the candidates: A = {2}, B = {0}; 1 and 3 are protected. The
    survivors 0, 1, 3 become outputs 0, 1, 2 in their order; token 2 joins output 0."""
    m = energy_matching(FOUR, 1, margin=0.7, alpha=1.0)
    assert m.src.tolist() == [[2]] and m.dst.tolist() == [[0]] and m.protected.tolist() == [[1, 3]]
    assert m.assignment(4).tolist() == [[0, 1, 0, 2]]


# -- hand-made cluster: isolated tokens are protected ----------------------------------------
ISOLATED = [0, 3, 6, 9]
CLUSTER = [1, 2, 4, 5, 7, 8]


def _cluster_and_isolated() -> torch.Tensor:
    """10 tokens in 8 dims: six near-duplicates of e0 (noise 0.01 in dims 5-7) at CLUSTER, and
    the isolated e1..e4 at ISOLATED (cosine 0 to every other token)."""
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(1, 10, 8)
    for p in CLUSTER:
        x[0, p, 0] = 1.0
        x[0, p, 5:] = 0.01 * torch.randn(3, generator=g)
    for i, p in enumerate(ISOLATED):
        x[0, p, 1 + i] = 1.0
    return x


@pytest.mark.parametrize("energy", ["paper", "elu"])
@pytest.mark.parametrize("r", [1, 2, 3])
def test_isolated_tokens_are_protected_and_merges_stay_in_the_cluster(r, energy):
    """m = 0.5: a cluster token's energy is about (6 - 4 * 0.39) / 10 = 0.44, an isolated
    one's (1 - 9 * 0.39) / 10 = -0.25, so the 2r <= 6 candidates all come from the cluster; each
    A token merges into its most similar B token."""
    metric = _cluster_and_isolated()
    m = energy_matching(metric, r, margin=0.5, alpha=1.0, energy=energy)
    src, dst = m.src[0].tolist(), m.dst[0].tolist()
    assert set(src) <= set(CLUSTER) and set(dst) <= set(CLUSTER) and not set(src) & set(dst)
    assert set(ISOLATED) <= set(m.protected[0].tolist())
    unit = F.normalize(metric[0], dim=-1)
    order = energy_scores(metric, 0.5, 1.0, energy)[0].argsort(descending=True, stable=True).tolist()
    b_set = order[1:2 * r:2]
    assert src == order[0:2 * r:2]
    for a, d in zip(src, dst):
        assert d == max(b_set, key=lambda b: float(unit[a] @ unit[b]))


def test_the_reducer_keeps_isolated_tokens_untouched_and_sizes_add_up():
    """With a class token in front: 11 tokens, r = 3 -> 8; the class token and the four isolated
    tokens come out unchanged with size 1; the six cluster tokens become the other three outputs
    (the three B tokens, which the A tokens joined), of sizes 6 in all."""
    patches = _cluster_and_isolated()
    cls = torch.full((1, 1, 8), 7.0)
    x = torch.cat([cls, patches], dim=1)
    state = TokenState.start(x, prefix=1)
    out = PiToMeReducer(3, margin=0.5, alpha=1.0)(x, state, AttnInfo(keys=x))
    assert out.shape == (1, 8, 8) and torch.equal(out[0, 0], cls[0, 0])
    size = state.size[0, :, 0]
    assert size.sum() == 11 and size[0] == 1
    for p in ISOLATED:
        rows = (out[0] == patches[0, p]).all(dim=-1).nonzero().flatten().tolist()
        assert len(rows) == 1 and size[rows[0]] == 1
    isolated_rows = [j for j in range(1, 8) if any(torch.equal(out[0, j], patches[0, p]) for p in ISOLATED)]
    cluster_rows = [j for j in range(1, 8) if j not in isolated_rows]
    assert len(cluster_rows) == 3 and size[cluster_rows].sum() == 6
    assert (out[0, cluster_rows, 0] > 0.99).all()  # merged near-duplicates of e0 stay near e0


# -- schedules -------------------------------------------------------------------------------
def test_margin_falls_linearly_with_depth():
    """The paper: m = 0.9 - 0.9 * l / L, l from 0 (the official timm/DeiT patch until 2024-11-30);
    other decays work alike, e.g. 0.9 - 0.8 * l / L."""
    assert margin_schedule(0.9, 0.9, 12) == pytest.approx([0.9 - 0.075 * i for i in range(12)])
    assert margin_schedule(0.9, 0.8, 4) == pytest.approx([0.9, 0.7, 0.5, 0.3])
    reduction = build(PiToMeParams(r=4), _info(depth=6))
    assert [red.margin for red in reduction.reducers] == pytest.approx([0.9, 0.75, 0.6, 0.45, 0.3, 0.15])


def test_ratio_schedule_maps_the_papers_keep_ratio_onto_r():
    """Ratio 0.9 on 196 patches: floor(196 * 0.1) = 19 -> 177 -> 17 -> 160 -> 16 -> 144 -> 14
    -> 130 -> 13 -> 117 -> 11 -> 106 -> 10 -> 96 -> 9 -> 87 -> 8 -> 79 -> 7 -> 72 -> 7 -> 65 -> 6."""
    assert ratio_schedule(0.9, 196, 12) == [19, 17, 16, 14, 13, 11, 10, 9, 8, 7, 7, 6]
    assert ratio_schedule(1.0, 196, 3) == [0, 0, 0]
    assert ratio_schedule(0.1, 10, 3) == [5, 2, 1]  # capped at half: 10 -> 5 -> 3 -> 2
    with pytest.raises(ParamError, match=r"pitome ratio=0.0 is out of range"):
        ratio_schedule(0.0, 196, 12)


def test_ratio_schedule_keeps_an_exact_product():
    """Ratio 0.68 on 256: floor(256 * 0.32) = 81 -> 175; 175 * 0.32 = 56 exactly, so 56 merge
    (the official code's floor(175 - 175 * 0.68) is 55 in floating point) -> 119 -> 38."""
    assert ratio_schedule(0.68, 256, 3) == [81, 56, 38]
    assert math.floor(175 - 175 * 0.68) == 55  # the float artefact the schedule avoids


def test_defaults_are_the_papers():
    """m = 0.9 - 0.9 * l / L, alpha = 1, the paper's energy form, proportional attention on."""
    p = PiToMeParams()
    assert (p.margin, p.margin_decay, p.alpha, p.energy, p.prop_attn) == (0.9, 0.9, 1.0, "paper", True)


def _info(depth: int):
    from vitbench.catalog import ModelInfo

    return ModelInfo(family="vit", depth=depth, embed_dim=64, num_heads=2, num_prefix_tokens=1,
                     num_patches=100, grid=(10, 10))


def _run(model, x, **params):
    reduced = vitbench.apply(copy.deepcopy(model), "pitome", **params)
    with torch.inference_mode():
        out = reduced(x)
    return out, reduction_context(reduced)


@pytest.mark.parametrize("r, counts", [
    (8, [93, 85, 77, 69, 61, 53]),
    (30, [71, 41, 21, 11, 6, 4]),  # 100 -> 70 -> 40 -> 20 (cap 20) -> 10 -> 5 -> 3 (cap 2)
    ([0, 10, 0, 20, 0, 5], [101, 91, 91, 71, 71, 66]),
])
def test_token_counts_follow_the_schedule_and_sizes_add_up(vit, r, counts):
    out, ctx = _run(vit, _images(), r=r)
    assert ctx.token_counts == counts
    assert torch.equal(ctx.state.size[:, 1:].sum(dim=1), torch.full((2, 1), 100.0))
    assert torch.equal(ctx.state.size[:, 0], torch.ones(2, 1))
    assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()


def test_r0_is_the_unpatched_model(vit):
    x = _images()
    with torch.inference_mode():
        expected = vit(x)
    out, ctx = _run(vit, x, r=0)
    assert torch.equal(out, expected) and ctx.token_counts == [101] * 6


def test_sources_agree_with_sizes(vit):
    _, ctx = _run(vit, _images(), r=12, trace_source=True)
    state = ctx.state
    assert torch.equal(state.source.sum(dim=-1, keepdim=True), state.size)
    assert torch.equal(state.source.sum(dim=1), torch.ones(2, 101))  # every patch covered once


def test_gradients_flow_through_the_merge(vit):
    model = vitbench.apply(copy.deepcopy(vit), "pitome", r=8).train()
    model(_images(2)).sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0


# -- a plain reference from the paper's description ------------------------------------------
def _merge_one(x, size, keys, r, prefix, margin, alpha, energy):
    """One image, Python loops. Output in the official layout: prefix, protected tokens by
    energy (highest first), then the B tokens by energy."""
    patches = list(range(prefix, x.shape[0]))
    r = min(r, len(patches) // 2)
    unit = F.normalize(keys, dim=-1)
    sim = (unit @ unit.T).tolist()

    def f(s: float) -> float:
        if s >= margin:
            return s if energy == "paper" else s - margin
        return alpha * (math.exp(s - margin) - 1.0)

    e = {p: sum(f(sim[p][q]) for q in patches) / len(patches) for p in patches}
    order = sorted(patches, key=lambda p: (-e[p], p))
    a_set, b_set, protected = order[0:2 * r:2], order[1:2 * r:2], order[2 * r:]
    total = {q: x[q] * size[q] for q in b_set}
    weight = {q: size[q].clone() for q in b_set}
    for p in a_set:
        q = max(b_set, key=lambda q: (sim[p][q], -b_set.index(q)))
        total[q] = total[q] + x[p] * size[p]
        weight[q] = weight[q] + size[p]
    keep = list(range(prefix)) + protected
    xs = [x[p] for p in keep] + [total[q] / weight[q] for q in b_set]
    ss = [size[p] for p in keep] + [weight[q] for q in b_set]
    return torch.stack(xs), torch.stack(ss)


def _reference_pitome(model, images, r, margin=0.9, margin_decay=0.9, alpha=1.0, energy="paper"):
    depth = len(model.blocks)

    def merge_one(layer, x, size, keys, prefix):
        m = margin - margin_decay * layer / depth
        return _merge_one(x, size, keys, r, prefix, m, alpha, energy)

    return plain_merging_forward(model, images, merge_one)


def _registers_avgpool():
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=3,
                             num_classes=10, reg_tokens=2, global_pool="avg").eval()


@pytest.mark.parametrize("params", [
    dict(r=9),
    dict(r=13, energy="elu", alpha=0.5, margin=0.8, margin_decay=0.4),
])
def test_logits_match_the_plain_reference(vit, params):
    x = _images()
    out, _ = _run(vit, x, **params)
    expected = _reference_pitome(vit, x, **params)
    assert (out - expected).abs().max() < 1e-4


def test_logits_match_the_reference_with_registers_and_avg_pool():
    model = _registers_avgpool()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out, ctx = _run(model, x, r=7)
    assert ctx.token_counts == [60, 53, 46, 39]
    assert (out - _reference_pitome(model, x, r=7)).abs().max() < 1e-4


# -- conformance and parameters --------------------------------------------------------------
@pytest.mark.parametrize("params, counts", [
    ({"r": 8}, [57, 49, 41, 33, 25, 17, 9, 5, 3, 2, 2, 2]),
    ({}, [49, 33, 17, 9, 5, 3, 2, 2, 2, 2, 2, 2]),  # default r = 16
])
def test_conforms(params, counts):
    report = check_method("pitome", params)
    assert (report.token_counts, report.output_shape) == (counts, (2, 10))


@pytest.mark.parametrize("bad, message", [
    (dict(r=-1), r"pitome.r=-1 is out of range; r must be an integer >= 0"),
    (dict(r=[1, -2]), r"pitome.r=\[1, -2\] is out of range"),
    (dict(r=[1, 2]), r"pitome.r has 2 entries; the model has 6 blocks"),
    (dict(margin=1.5), r"pitome.margin=1.5 is out of range; it must be in \[-1, 1\]"),
    (dict(margin_decay=2.5), r"pitome.margin_decay=2.5 is out of range; with margin=0.9 it must be in \[-0.1, 1.9\]"),
    (dict(alpha=-1.0), r"pitome.alpha=-1.0 is out of range; it must be >= 0"),
    (dict(alpha=float("nan")), r"pitome\.alpha=nan is not a finite number"),
    (dict(energy="gauss"), r"pitome.energy='gauss'; valid values: paper, elu"),
    (dict(q=1), r"unknown parameter pitome.q; valid parameters of pitome: r, margin, margin_decay, alpha"),
])
def test_bad_parameters_name_the_value(vit, bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(copy.deepcopy(vit), "pitome", **bad)
