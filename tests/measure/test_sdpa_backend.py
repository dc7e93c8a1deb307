"""Which fused attention kernel a forward ran (:mod:`vitbench.measure.sdpa_backend`): one entry per
call of ``F.scaled_dot_product_attention``, as PyTorch's dispatcher picks it, the mask said."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F

import vitbench
from vitbench.measure.sdpa_backend import sdpa_backends


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model("test_vit", pretrained=False).eval()


def test_every_block_of_the_unpatched_model_is_one_unmasked_call(vit):
    text = sdpa_backends(vit, torch.randn(2, 3, 160, 160))
    assert text.endswith("in 6 calls") and "mask" not in text and "unknown" not in text
    assert F.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"  # put back after


def test_tomes_proportional_attention_passes_a_mask_and_without_it_none(vit):
    images = torch.randn(2, 3, 160, 160)
    prop = sdpa_backends(vitbench.apply(copy.deepcopy(vit), "tome", r=4), images)
    plain = sdpa_backends(vitbench.apply(copy.deepcopy(vit), "tome", r=4, prop_attn=False), images)
    assert "(with a mask)" in prop and "mask" not in plain


def test_unfused_attention_makes_no_call(vit):
    unfused = copy.deepcopy(vit)
    for blk in unfused.blocks:
        blk.attn.fused_attn = False
    assert sdpa_backends(unfused, torch.randn(1, 3, 160, 160)) == "no fused attention"
