"""PPT against an oracle written from the paper's description (docs/methods.md §3), not from
the plugin: per image, explicit attention, plain Python sorting. The official PPT code keeps
the pruned tokens sorted by score, highest first; an image that prunes at one block and pools
at a later one shows whether the layout is the same, because ToMe's split into sets A and B
alternates over token positions (issue 9, item 9)."""
from __future__ import annotations

import pytest
import torch

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.testing import tiny_vit
from vitbench.testing.reference_tome import _merge_one as tome_merge_one


def _attend(attn, x, size):
    """One image's attention ``x [N, C]`` with proportional attention: output, probabilities
    ``[h, N, N]``, head-averaged keys ``[N, d]`` and values over all heads ``[N, C]``."""
    n, c = x.shape
    q, k, v = attn.qkv(x).reshape(n, 3, attn.num_heads, attn.head_dim).permute(1, 2, 0, 3)
    q, k = attn.q_norm(q), attn.k_norm(k)
    probs = ((q * attn.scale) @ k.transpose(-2, -1) + size.log()[None, None, :, 0]).softmax(-1)
    out = (probs @ v).transpose(0, 1).reshape(n, c)
    return attn.proj(attn.norm(out)), probs, k.mean(0), v.transpose(0, 1).reshape(n, c)


@torch.no_grad()
def reference_ppt(model, images, r, layers, threshold, order="score"):
    """Logits, and per image the ``(block, "prune"|"pool", tokens after)`` steps, of PPT with the
    ATS score (``cls-attn``) on an unpatched timm ViT with one class token, image by image.

    The paper: significance ``s_j = sum_h A[h, 0, j] * ||V_j||`` over the patch tokens,
    normalised to sum 1; ``var(s)`` (unbiased) below ``threshold`` -> pool ``r`` tokens with
    ToMe; otherwise keep the class token and the ``N - 1 - r`` highest-scoring patch tokens,
    highest first (``order="score"``, the official layout) or by position (``"original"``).
    """
    logits, steps = [], []
    for image in images:
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(image[None]))))[0]
        size = torch.ones(x.shape[0], 1)
        taken = []
        for i, blk in enumerate(model.blocks):
            out, probs, keys, values = _attend(blk.attn, blk.norm1(x), size)
            x = x + blk.ls1(out)
            if i in layers:
                n = x.shape[0]
                r_now = min(r, (n - 1) // 2)
                s = probs[:, 0, 1:].sum(0) * values[1:].norm(dim=-1)
                s = s / s.sum()
                if float(s.var(unbiased=True)) < threshold:
                    x, size = tome_merge_one(x, size, keys, r_now, prefix=1)
                    taken.append((i, "pool", x.shape[0]))
                else:
                    best = sorted(range(n - 1), key=lambda j: -float(s[j]))[: n - 1 - r_now]
                    if order == "original":
                        best = sorted(best)
                    keep = [0] + [1 + j for j in best]
                    x, size = x[keep], size[keep]
                    taken.append((i, "prune", x.shape[0]))
            x = x + blk.ls2(blk.mlp(blk.norm2(x)))
        x = model.norm(x)
        logits.append(model.head(model.fc_norm(x[0])))
        steps.append(taken)
    return torch.stack(logits), steps


def _prune_then_pool_vit():
    """tiny_vit whose block 1 attends sharply (q and k x8: score variance 1.5e-4..2.8e-4, above
    PPT's default threshold 7e-5, so every image prunes there) while block 4 stays near uniform
    (variance ~5e-6: every image pools)."""
    model = tiny_vit()
    with torch.no_grad():
        model.blocks[1].attn.qkv.weight[: 2 * model.embed_dim].mul_(8.0)
    return model


def _images(n=4):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _ppt(model, **params):
    return vitbench.apply(model, "ppt", **params)


@pytest.mark.parametrize("order", ["score", "original"])
def test_prune_then_pool_matches_the_oracle(order):
    params = dict(r=16, layers=(1, 4), threshold=7e-5)
    images = _images()
    expected, steps = reference_ppt(_prune_then_pool_vit(), images, order=order, **params)
    assert steps == [[(1, "prune", 49), (4, "pool", 33)]] * 4  # the case this test is about
    model = _ppt(_prune_then_pool_vit(), order=order, **params)
    with torch.inference_mode():
        logits = model(images)
    assert reduction_context(model).token_counts == [65] + [49] * 3 + [33] * 8
    assert (logits - expected).abs().max() < 1e-4


def test_the_layout_changes_the_logits_of_prune_then_pool():
    """The oracle test above can fail: the two layouts pair different tokens at block 4."""
    params = dict(r=16, layers=(1, 4), threshold=7e-5)
    with torch.inference_mode():
        by_score = _ppt(_prune_then_pool_vit(), **params)(_images())
        by_position = _ppt(_prune_then_pool_vit(), order="original", **params)(_images())
    assert (by_score - by_position).abs().max() > 1e-3


def test_mixed_batch_matches_the_oracle_image_by_image():
    # threshold 2e-4: images 0 and 2 (block-1 variance 1.5e-4, 1.9e-4) pool there, 1 and 3 prune
    params = dict(r=16, layers=(1, 4), threshold=2e-4)
    images = _images()
    expected, steps = reference_ppt(_prune_then_pool_vit(), images, **params)
    assert [s[0][1] for s in steps] == ["pool", "prune", "pool", "prune"]
    model = _ppt(_prune_then_pool_vit(), **params)
    with torch.inference_mode():
        logits = model(images)
    assert (logits - expected).abs().max() < 1e-4


def test_order_is_validated():
    with pytest.raises(ParamError, match=r"ppt.order='spatial'; valid orders: score, original"):
        vitbench.apply(tiny_vit(), "ppt", order="spatial")


@pytest.mark.slow
def test_deit_small_prune_then_pool_matches_the_oracle(deit_small):
    """DeiT-S (random weights), r=50 at blocks 3, 6, 9 with the default threshold; block 3
    attends sharply (q and k x8) so the images prune there and pool later."""
    import copy

    model = copy.deepcopy(deit_small)
    with torch.no_grad():
        model.blocks[3].attn.qkv.weight[: 2 * model.embed_dim].mul_(8.0)
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    expected, steps = reference_ppt(model, images, r=50, layers=(3, 6, 9), threshold=7e-5)
    assert all(s[0][1] == "prune" and "pool" in [t[1] for t in s[1:]] for s in steps), steps
    reduced = vitbench.apply(copy.deepcopy(model), "ppt")
    with torch.inference_mode():
        logits = reduced(images)
    assert reduction_context(reduced).token_counts[-1] == 49
    assert (logits - expected).abs().max() < 1e-4
