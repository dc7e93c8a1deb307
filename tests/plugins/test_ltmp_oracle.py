"""LTMP inference against an oracle written from the paper's description (docs/methods.md §2),
not from the plugin: per image, explicit attention, Python lists of tokens. The official LTMP
code lays the tokens out after every block as ToMe does -- prefix, the unmerged tokens of set
A, then set B -- and the next block's split alternates over that layout; with merging in every
block the layout decides which tokens are paired from block 1 on (issue 9, item 9)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.errors import ParamError
from vitbench.testing import tiny_vit
from tests_support import sharp_vit as _sharp_vit  # tests/tests_support.py
from vitbench_plugins.ltmp.reduction import LTMPReducer, kept_tokens


def _attend(attn, x, size):
    """One image's attention ``x [N, C]`` with proportional attention: output, probabilities
    ``[h, N, N]`` and head-averaged keys ``[N, d]``."""
    n, c = x.shape
    q, k, v = attn.qkv(x).reshape(n, 3, attn.num_heads, attn.head_dim).permute(1, 2, 0, 3)
    q, k = attn.q_norm(q), attn.k_norm(k)
    probs = ((q * attn.scale) @ k.transpose(-2, -1) + size.log()[None, None, :, 0]).softmax(-1)
    out = (probs @ v).transpose(0, 1).reshape(n, c)
    return attn.proj(attn.norm(out)), probs, k.mean(0)


def _reduce_one(x, size, probs, keys, theta_m, theta_p, order):
    """One image's LTMP step on the token list, from the paper: ToMe's split (positions after the
    class token alternate, position 1 in B, 2 in A, ...), an A token merges into its most similar
    B token when the cosine similarity exceeds ``theta_m``; importance is the attention a token
    receives averaged over heads and queries, a destination takes its group's max; tokens with
    importance ``<= theta_p`` go, the class token never."""
    n = x.shape[0]
    unit = F.normalize(keys, dim=-1)
    importance = probs.mean(dim=(0, 1)).tolist()  # column j: the attention token j receives
    a_pos = [p for p in range(1, n) if p % 2 == 0]
    b_pos = [p for p in range(1, n) if p % 2 == 1]
    into = {}
    for p in a_pos:
        sims = (unit[b_pos] @ unit[p]).tolist()
        j = max(range(len(b_pos)), key=lambda i: sims[i])
        if sims[j] > theta_m:
            into[p] = b_pos[j]
    total = {q: x[q] * size[q] for q in range(n)}
    weight = {q: size[q].clone() for q in range(n)}
    for src, dst in into.items():
        total[dst] = total[dst] + x[src] * size[src]
        weight[dst] = weight[dst] + size[src]
        importance[dst] = max(importance[dst], importance[src])
    if order == "bipartite":
        layout = [0] + [p for p in a_pos if p not in into] + b_pos
    else:
        layout = [p for p in range(n) if p not in into]
    kept = [p for p in layout if p == 0 or importance[p] > theta_p]
    return (torch.stack([total[p] / weight[p] for p in kept]),
            torch.stack([weight[p] for p in kept]))


@torch.no_grad()
def reference_ltmp(model, images, theta_m, theta_p, order="bipartite"):
    """Logits and per image the token count after every block of LTMP inference with
    thresholds ``theta_m``/``theta_p`` (one per block) on an unpatched timm ViT with a class
    token, image by image (so no padding)."""
    logits, counts = [], []
    for image in images:
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(image[None]))))[0]
        size = torch.ones(x.shape[0], 1)
        per_block = []
        for i, blk in enumerate(model.blocks):
            out, probs, keys = _attend(blk.attn, blk.norm1(x), size)
            x = x + blk.ls1(out)
            x, size = _reduce_one(x, size, probs, keys, theta_m[i], theta_p[i], order)
            per_block.append(x.shape[0])
            x = x + blk.ls2(blk.mlp(blk.norm2(x)))
        x = model.norm(x)
        logits.append(model.head(model.fc_norm(x[0])))
        counts.append(per_block)
    return torch.stack(logits), counts




def _ltmp(model, theta_m, theta_p, **params):
    model = vitbench.apply(model, "ltmp", **params)
    with torch.no_grad():
        for r in model.modules():
            if isinstance(r, LTMPReducer):
                r.theta_m.fill_(theta_m[r.index])
                r.theta_p.fill_(theta_p[r.index])
    return model


def _images(n=6):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _block_counts(model):
    """Per image, the tokens left after every block of the last inference forward."""
    counts = reduction_context(model).state.private["ltmp_counts"]
    return torch.stack([counts[i] for i in sorted(counts)], dim=1).tolist()


CASES = {  # merging in every block; with and without pruning
    "merge": ([0.6] * 12, [0.0] * 12),
    "merge+prune": ([0.8] * 12, [0.015] * 12),
    "per-block": ([0.5 + 0.03 * i for i in range(12)], [0.0] * 3 + [0.012] * 9),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("order", ["bipartite", "original"])
def test_padded_batch_matches_the_oracle(case, order):
    theta_m, theta_p = CASES[case]
    images = _images()
    expected, expected_counts = reference_ltmp(_sharp_vit(), images, theta_m, theta_p, order)
    assert all(c[0] < 65 for c in expected_counts)  # every image reduces from block 0 on
    assert len({c[-1] for c in expected_counts}) > 1  # counts differ per image: the batch pads
    model = _ltmp(_sharp_vit(), theta_m, theta_p, order=order)
    with torch.inference_mode():
        logits = model(images)
    assert _block_counts(model) == expected_counts
    assert (logits - expected).abs().max() < 1e-4


def test_the_layout_changes_counts_and_logits():
    """The oracle test above can fail: the two layouts pair different tokens from block 1 on."""
    theta_m, theta_p = CASES["merge"]
    images = _images()
    by_layout, by_position = [_ltmp(_sharp_vit(), theta_m, theta_p, order=o)
                              for o in ("bipartite", "original")]
    with torch.inference_mode():
        a, b = by_layout(images), by_position(images)
    counts_a, counts_b = _block_counts(by_layout), _block_counts(by_position)
    assert [c[0] for c in counts_a] == [c[0] for c in counts_b]  # block 0 pairs the same tokens
    assert all(x[1:] != y[1:] for x, y in zip(counts_a, counts_b))
    assert (a - b).abs().max() > 1e-2


def test_one_block_by_hand():
    """cls + 4 patches; positions 1, 3 are set B, 2, 4 set A. Token 2's key is token 1's (cosine
    1 > 0.9): it merges into 1; token 4's key is orthogonal to both B keys: it stays. Layout:
    [cls, 4 (unmerged A), 1 (+2, size 2), 3]; in original order [cls, 1 (+2), 3, 4]."""
    keys = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.6, 0.8, 0.0],
                          [0.0, 0.0, 1.0]]])
    x = torch.arange(5.0).repeat_interleave(2).reshape(1, 5, 2) + torch.tensor([0.0, 0.5])
    attn = torch.full((1, 1, 5, 5), 0.2)  # every importance 0.2 > theta_p = 0: nothing pruned
    for order, layout, size in (("bipartite", [0, 4, 1, 3], [1, 1, 2, 1]),
                                ("original", [0, 1, 3, 4], [1, 2, 1, 1])):
        state = TokenState.start(x, prefix=1)
        out = LTMPReducer(0, tau=0.1, order=order)(x, state, AttnInfo(keys=keys, attn=attn))
        expected = x[0, layout].clone()
        expected[layout.index(1)] = (x[0, 1] + x[0, 2]) / 2
        assert torch.equal(out[0], expected), order
        assert state.size[0, :, 0].tolist() == size


@pytest.mark.parametrize("order", ["bipartite", "original"])
def test_training_masks_the_tokens_inference_removes_in_every_block(order):
    """The learned thresholds mean the same in both modes: training (masks, tokens stay) lays out
    the tokens it keeps as inference does, so every block compares the same similarities and
    importances with the thresholds and keeps as many tokens per image."""
    theta_m, theta_p = CASES["merge+prune"]
    model = _ltmp(_sharp_vit(), theta_m, theta_p, order=order)
    images = _images()
    with torch.no_grad():
        model.train()
        model(images)
        kept = reduction_context(model).state.private["ltmp_kept"]
        trained = (torch.stack([kept[i] for i in range(12)], dim=1) * 65).round().long().tolist()
        model.eval()
        model(images)
    assert _block_counts(model) == trained
    assert kept_tokens(model).tolist() == [t[-1] for t in trained]


def test_order_is_validated():
    with pytest.raises(ParamError, match=r"ltmp.order='tome'; valid values: bipartite, original"):
        vitbench.apply(tiny_vit(), "ltmp", order="tome")


@pytest.mark.slow
def test_deit_small_merging_in_every_block_matches_the_oracle(deit_small):
    """DeiT-S (random weights, q and k x4 so attention is not flat), merging from block 0 on."""
    import copy

    model = copy.deepcopy(deit_small)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[: 2 * model.embed_dim].mul_(4.0)
    theta_m, theta_p = [0.4] * 12, [0.0] * 3 + [0.004] * 9
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    expected, expected_counts = reference_ltmp(model, images, theta_m, theta_p)
    assert all(c[0] < 197 for c in expected_counts)  # merges from block 0 on
    reduced = _ltmp(copy.deepcopy(model), theta_m, theta_p)
    with torch.inference_mode():
        logits = reduced(images)
    assert _block_counts(reduced) == expected_counts
    assert (logits - expected).abs().max() < 1e-4
