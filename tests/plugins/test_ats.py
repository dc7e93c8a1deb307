"""ATS: adaptive token sampling (plugins/ats/; Fayyaz et al., ECCV 2022, §3)."""
from __future__ import annotations

import math

import pytest
import timm
import torch

import vitbench
from vitbench.engine import enable_source_tracing, reduction_context
from vitbench.core.params import make_params
from vitbench.errors import ParamError, UnsupportedError
from vitbench.testing import tiny_vit
from vitbench_plugins.ats import ATSParams
from vitbench_plugins.ats.reduction import COUNTS, VALID, sample_points, sampled_tokens

pytestmark = pytest.mark.usefixtures("single_thread")


def kept_positions(scores: list[float], k: int) -> list[int]:
    return sampled_tokens(torch.tensor([scores]), k)[0].nonzero().flatten().tolist()


def brute_force(scores: torch.Tensor, k: int) -> set[int]:
    """Inverse transform sampling spelled out: sort ascending (ties by position), the CDF, and
    for every point (i - 1/2)/K the first sorted token whose CDF reaches it."""
    values = scores.double().tolist()
    order = sorted(range(len(values)), key=lambda j: (values[j], j))
    total = sum(values)
    cdf, running = [], 0.0
    for j in order:
        running += values[j]
        cdf.append(running / total)
    cdf[-1] = 1.0
    kept = set()
    for u in sample_points(k).tolist():
        first = next(i for i, c in enumerate(cdf) if c >= u)
        kept.add(order[first])
    return kept


# -- the sampling rule: hand-made oracles ------------------------------------------------------


def test_sample_points_are_the_midpoints():
    assert sample_points(4).tolist() == [0.125, 0.375, 0.625, 0.875]


def test_hand_inverted_cdf():
    """Scores [0.4, 0.1, 0.2, 0.3], sorted ascending: 0.1 (pos 1), 0.2 (pos 2), 0.3 (pos 3),
    0.4 (pos 0); CDF 0.1, 0.3, 0.6, 1.0. K = 2: points 0.25 -> pos 2, 0.75 -> pos 0.
    K = 3: 1/6 -> pos 2, 1/2 -> pos 3, 5/6 -> pos 0. K = 4: 0.125 -> 2, 0.375 -> 3, 0.625 and
    0.875 -> 0 (drawn twice, kept once)."""
    scores = [0.4, 0.1, 0.2, 0.3]
    assert kept_positions(scores, 2) == [0, 2]
    assert kept_positions(scores, 3) == [0, 2, 3]
    assert kept_positions(scores, 4) == [0, 2, 3]
    assert kept_positions(scores, 10) == [0, 1, 2, 3]  # 0.05 -> pos 1 as well


def test_peaked_scores_keep_fewer_than_k():
    """One token holds 0.82, nine hold 0.02 each (CDF 0.02, 0.04, ..., 0.18, then 1). K = 10:
    point 0.05 draws the 3rd small token, 0.15 the 8th, and 0.25 .. 0.95 all draw the peak: 3
    tokens kept, not 10 -- the adaptive part. Ties go by position, so the 3rd and 8th small
    tokens are positions 3 and 8."""
    scores = [0.82] + [0.02] * 9
    assert kept_positions(scores, 10) == [0, 3, 8]


@pytest.mark.parametrize("n", [7, 10, 64])
def test_uniform_scores_keep_exactly_min_k_n(n):
    scores = torch.full((1, n), 1.0 / n)
    for k in range(1, 2 * n + 1):
        assert int(sampled_tokens(scores, k).sum()) == min(k, n), k


def test_a_zero_score_is_never_drawn():
    assert kept_positions([0.0, 0.5, 0.0, 0.5], 50) == [1, 3]


def test_closed_form_equals_drawing_every_point():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(1, 40, (1,), generator=g))
        k = int(torch.randint(1, 80, (1,), generator=g))
        scores = torch.rand(n, generator=g) ** 4  # skewed
        if trial % 4 == 0:  # ties and zeros
            scores = torch.randint(0, 3, (n,), generator=g).float()
            if scores.sum() == 0:
                scores[0] = 1.0
        got = set(sampled_tokens(scores[None], k)[0].nonzero().flatten().tolist())
        assert got == brute_force(scores, k), (n, k, scores)


def test_keep_1_samples_one_point_per_patch_and_still_drops():
    """keep = 1 is the paper's DeiT-S setting (K = all patches), not a no-op: a uniform score
    vector keeps every token, a non-uniform one loses the tokens whose CDF step holds no point."""
    n = 10
    assert int(sampled_tokens(torch.full((1, n), 0.1), n).sum()) == n
    assert int(sampled_tokens(torch.tensor([[0.5] + [0.5 / 9] * 9]), n).sum()) < n


# -- on a model ----------------------------------------------------------------------------


def sharpened_test_vit(factor: float = 6.0, **kwargs) -> torch.nn.Module:
    """timm's test_vit (100 patches + cls, 6 blocks, 160x160), random weights, with queries and
    keys scaled so that the class token attends sharply and images keep different counts."""
    torch.manual_seed(0)
    model = timm.create_model("test_vit", **kwargs).eval()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[: 2 * model.embed_dim] *= factor
    return model


def images(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 3, 160, 160, generator=torch.Generator().manual_seed(1))


def run(model: torch.nn.Module, x: torch.Tensor, **params):
    reduced = vitbench.apply(model, "ats", **params)
    with torch.inference_mode():
        out = reduced(x)
    return out, reduction_context(reduced)


def test_switched_off_equals_the_unpatched_model():
    model = sharpened_test_vit()
    x = images(2)
    with torch.inference_mode():
        expected = model(x)
    out, ctx = run(model, x, layers=())
    assert torch.equal(out, expected)
    assert ctx.token_counts == [101] * 6


def test_counts_at_the_first_listed_block_match_an_independent_computation():
    """Block 2 of the unpatched model: the class-token attention and the values computed from
    timm's own modules, the scores of ATS (Eq. 3), then every point drawn by brute force."""
    model = sharpened_test_vit()
    x = images()
    captured = {}
    handle = model.blocks[2].register_forward_pre_hook(lambda mod, args: captured.__setitem__("x", args[0]))
    with torch.inference_mode():
        model(x)
    handle.remove()
    attn = model.blocks[2].attn
    with torch.inference_mode():
        y = model.blocks[2].norm1(captured["x"])
        b, n, c = y.shape
        q, k, v = attn.qkv(y).reshape(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # [B, h, N, N]
        scores = a[:, :, 0, 1:].sum(dim=1) * v[:, :, 1:].transpose(1, 2).reshape(b, n - 1, -1).norm(dim=-1)
    k_points = math.ceil(0.6 * 100)
    expected = [len(brute_force(s, k_points)) for s in scores]
    _, ctx = run(model, x, keep=0.6, layers=(2, 4))
    assert ctx.state.private[COUNTS][2].tolist() == expected
    assert len(set(expected)) > 1  # the images really keep different counts
    assert ctx.token_counts[:2] == [101, 101] and ctx.token_counts[2] == 1 + max(expected)


def test_token_counts_on_test_vit():
    """keep = 0.5 at blocks 1 and 3: K = 50 points each; every image keeps <= 50 patches, the
    batch is as wide as its largest image, and the sizes say which tokens are real."""
    _, ctx = run(sharpened_test_vit(), images(), keep=0.5, layers=(1, 3))
    counts, per_image = ctx.token_counts, ctx.state.private[COUNTS]
    assert counts[0] == 101
    assert counts[1] == counts[2] == 1 + int(per_image[1].max()) <= 51
    assert counts[3] == counts[4] == counts[5] == 1 + int(per_image[3].max())
    assert (per_image[3] <= per_image[1]).all() and (per_image[3] <= 50).all()
    size = ctx.state.size[..., 0]
    assert size[:, 1:].sum(dim=1).tolist() == per_image[3].float().tolist()
    assert torch.equal(ctx.state.private[VALID], size > 0)
    bias = ctx.state.key_bias[:, 0, 0]
    assert torch.equal(bias == float("-inf"), size == 0) and (bias[size > 0] == 0).all()


def test_keep_1_drops_tokens_on_a_model():
    """The paper's setting: one point per original patch at every listed block."""
    out, ctx = run(sharpened_test_vit(), images(2), keep=1.0, layers=(1, 3))
    assert ctx.token_counts[-1] < 101 and torch.isfinite(out).all()


@pytest.mark.parametrize("pool", ["token", "avg", "max", "avgmax"])
def test_padded_batch_gives_each_image_its_own_logits(pool):
    """Images with different counts batched (padded) give the logits each gets alone; average,
    max and avg+max pooling ignore the padding (size 0)."""
    model = sharpened_test_vit(global_pool=pool)
    x = images()
    out, ctx = run(model, x, keep=0.6, layers=(1, 3, 4))
    per_image = ctx.state.private[COUNTS]
    assert len(set(per_image[4].tolist())) > 1  # padding happened
    for i in range(x.shape[0]):
        with torch.inference_mode():
            alone = model(x[i : i + 1])
        assert ctx.token_counts[-1] >= 1 + int(per_image[4][i])
        torch.testing.assert_close(out[i : i + 1], alone, rtol=0, atol=1e-5)
        assert torch.isfinite(alone).all()


def test_source_tracing_follows_the_kept_patches():
    """Each real token covers exactly its own original patch; padding covers nothing."""
    model = vitbench.apply(sharpened_test_vit(), "ats", keep=0.5, layers=(1, 3))
    enable_source_tracing(model)
    with torch.inference_mode():
        model(images())
    state = reduction_context(model).state
    covers = state.source.sum(dim=-1)  # [B, N]
    assert torch.equal(covers > 0, state.private[VALID]) and (covers <= 1).all()
    assert (state.source.sum(dim=1) <= 1).all()  # no original patch covered twice


def test_deterministic_and_finite_in_eval():
    model = vitbench.apply(sharpened_test_vit(), "ats", keep=0.4, layers=(0, 2, 4))
    x = images(2)
    with torch.inference_mode():
        first, second = model(x), model(x)
    assert torch.equal(first, second) and torch.isfinite(first).all()


def test_conforms(vitbench_check_method):
    """tiny_vit (64 patches, 12 blocks), keep = 0.5 at the default blocks 3..11: K = 32 points."""
    report = vitbench_check_method("ats", {"keep": 0.5})
    counts = report.token_counts
    assert counts[:3] == [65] * 3 and counts[3] <= 1 + 32 and counts[-1] < counts[3]


# -- parameters ------------------------------------------------------------------------------


def test_defaults_are_the_paper_deit_s_setting_scaled_to_the_depth():
    from vitbench.kit import blocks_from_quarter

    params = ATSParams()
    assert params.keep == 1.0 and params.layers is None
    assert blocks_from_quarter(12) == tuple(range(3, 12)) and blocks_from_quarter(6) == (1, 2, 3, 4, 5)


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0.0}, r"ats.keep=0.0 is out of range; it must be in \(0, 8\]"),
    ({"keep": -0.5}, r"ats.keep=-0.5 is out of range"),
    ({"keep": 8.5}, r"ats.keep=8.5 is out of range"),
    ({"keep": float("nan")}, r"ats.keep=nan is not a finite number"),
    ({"layers": (-1,)}, "every item must be >= 0"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("ats", ATSParams, kwargs)  # what the command line, the plan and apply go through


def test_a_block_the_model_lacks_and_a_model_without_class_token_are_refused():
    with pytest.raises(ParamError, match="ats.layers contains 6; valid block indices for this model: 0..5"):
        vitbench.apply(timm.create_model("test_vit").eval(), "ats", layers=(1, 6))
    no_cls = tiny_vit(class_token=False, global_pool="avg")
    with pytest.raises(UnsupportedError, match="ats needs a class token"):
        vitbench.apply(no_cls, "ats")
