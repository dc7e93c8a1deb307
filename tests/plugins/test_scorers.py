"""Token scorers (docs/methods.md §4) against a direct computation from the attention matrix."""
from __future__ import annotations

import torch

from vitbench.engine import AttnInfo
from vitbench.host import get_host


def _info(b=2, h=3, n=6, d=4):
    torch.manual_seed(0)
    attn = torch.randn(b, h, n, n).softmax(-1)
    values = torch.randn(b, h, n, d)
    return AttnInfo(attn=attn, cls_attn=attn[:, :, 0], values=values)


def test_scores_are_normalised_per_image():
    info = _info()
    for name in ("cls-attn", "entropy", "average"):
        s = get_host().scorer(name).score(info, 1)
        assert s.shape == (2, 5)
        assert torch.allclose(s.sum(-1), torch.ones(2))


def test_cls_attn_is_head_sum_times_value_norm():
    info = _info()
    s = get_host().scorer("cls-attn").score(info, 1)
    b, j = 1, 2  # patch 2 = token 3
    vnorm = torch.cat([info.values[b, h, j + 1] for h in range(3)]).norm()
    raw = info.attn[b, :, 0, j + 1].sum() * vnorm
    total = sum(info.attn[b, :, 0, t + 1].sum() * torch.cat([info.values[b, h, t + 1] for h in range(3)]).norm()
                for t in range(5))
    assert torch.allclose(s[b, j], raw / total)


def test_entropy_is_row_entropy_times_value_norm():
    info = _info()
    s = get_host().scorer("entropy").score(info, 1)
    raw = []
    for t in range(1, 6):
        a = info.attn[0, :, t]
        ent = (-(a * (a + 1e-6).log()).sum(-1)).mean()
        raw.append(ent * info.values[0, :, t].flatten().norm())
    raw = torch.stack(raw)
    assert torch.allclose(s[0], raw / raw.sum())


def test_average_is_mean_cls_attention():
    info = _info()
    s = get_host().scorer("average").score(info, 1)
    raw = info.attn[0, :, 0, 1:].mean(0)
    assert torch.allclose(s[0], raw / raw.sum())
