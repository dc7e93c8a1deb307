"""The significance scores (vitbench/kit/scores.py) are the registered scorers' functions."""
from __future__ import annotations

import torch

from vitbench.engine import AttnInfo
from vitbench.kit import average_score, cls_attn_score, entropy_score
from vitbench.host import get_host


def test_the_registered_scorers_are_the_kit_functions():
    for name, fn in (("cls-attn", cls_attn_score), ("entropy", entropy_score), ("average", average_score)):
        assert get_host().scorer(name).score is fn


def test_average_is_the_head_mean_of_the_class_row_normalised():
    attn = torch.tensor([[[[0.5, 0.25, 0.25], [0, 0, 0], [0, 0, 0]],
                          [[0.5, 0.125, 0.375], [0, 0, 0], [0, 0, 0]]]])  # [B=1, h=2, N=3, N]
    s = average_score(AttnInfo(attn=attn, cls_attn=attn[:, :, 0]), 1)
    assert s.tolist() == [[0.375, 0.625]]
