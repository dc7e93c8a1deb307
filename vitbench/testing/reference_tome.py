"""An independent, deliberately plain ToMe forward: explicit (unfused) attention and per-image
Python loops for the matching (docs/methods.md, "ToMe"). vitbench's engine must give the same outputs;
a plugin author can check a ToMe variant against it the same way."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def plain_attention(attn, x, size):
    """A timm attention block's output with proportional attention, unfused, and its head-averaged
    keys: what a plain reference forward of a merging method builds on."""
    b, n, c = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    logits = (q * attn.scale) @ k.transpose(-2, -1) + size.log()[:, None, None, :, 0]
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
    return attn.proj(attn.norm(out)), k.mean(1)


def _merge_one(x, size, keys, r, prefix):
    n = x.shape[0]
    a_pos = [p for p in range(prefix, n) if p % 2 == 0]
    b_pos = [p for p in range(prefix, n) if p % 2 == 1]
    r = min(r, (n - prefix) // 2)
    unit = F.normalize(keys, dim=-1)
    best = []
    for p in a_pos:
        sims = [float(unit[p] @ unit[q]) for q in b_pos]
        j = max(range(len(b_pos)), key=lambda i: sims[i])
        best.append((sims[j], p, b_pos[j]))
    order = sorted(range(len(best)), key=lambda i: -best[i][0])
    merged = {best[i][1]: best[i][2] for i in order[:r]}
    total = {q: x[q] * size[q] for q in b_pos}
    weight = {q: size[q].clone() for q in b_pos}
    for src, dst in merged.items():
        total[dst] = total[dst] + x[src] * size[src]
        weight[dst] = weight[dst] + size[src]
    keep = list(range(prefix)) + [p for p in a_pos if p not in merged]
    xs = [x[p] for p in keep] + [total[q] / weight[q] for q in b_pos]
    ss = [size[p] for p in keep] + [weight[q] for q in b_pos]
    return torch.stack(xs), torch.stack(ss)


#: ``(block, x [N, C], size [N, 1], keys [N, d], prefix) -> (x, size)``: one image's merge
MergeOne = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def plain_merging_forward(model, images, merge_one: MergeOne):
    """Logits of ``model`` (an unpatched timm ViT) whose every block reduces each image's tokens
    with ``merge_one`` after the attention residual, with proportional attention and a
    size-weighted average pool: the plain forward a merging method's reference is built on."""
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
    size = torch.ones(x.shape[0], x.shape[1], 1, device=x.device)
    prefix = model.num_prefix_tokens
    for block, blk in enumerate(model.blocks):
        out, keys = plain_attention(blk.attn, blk.norm1(x), size)
        x = x + blk.ls1(out)
        pairs = [merge_one(block, x[i], size[i], keys[i], prefix) for i in range(x.shape[0])]
        x = torch.stack([p[0] for p in pairs])
        size = torch.stack([p[1] for p in pairs])
        x = x + blk.ls2(blk.mlp(blk.norm2(x)))
    x = model.norm(x)
    if model.global_pool == "avg":
        w = size[:, prefix:]
        pooled = (x[:, prefix:] * w).sum(1) / w.sum(1)
    else:
        pooled = x[:, 0]
    return model.head(model.head_drop(model.fc_norm(pooled)))


def reference_tome(model, images, r_per_block):
    """Logits of ``model`` (an unpatched timm ViT) with ToMe merging ``r_per_block[i]`` tokens."""
    def merge_one(block, x, size, keys, prefix):
        r = r_per_block[block]
        return _merge_one(x, size, keys, r, prefix) if r > 0 else (x, size)

    return plain_merging_forward(model, images, merge_one)
