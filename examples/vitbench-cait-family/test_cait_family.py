"""The cait family: methods that need only a token step reduce CaiT; the others are refused."""
import pytest
import timm
import torch

import vitbench
from vitbench.errors import UnsupportedError
from vitbench.kit.family import reduction_context


def tiny_cait() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("cait_xxs24_224", img_size=32, patch_size=4, embed_dim=48, depth=4,
                             num_heads=2, num_classes=10).eval()


def test_keeping_every_token_is_the_model():
    base, x = tiny_cait(), torch.randn(2, 3, 32, 32)
    model = vitbench.apply(tiny_cait(), "random", keep=1.0, layers=(1, 2))
    with torch.no_grad():
        torch.testing.assert_close(model(x), base(x))


def test_the_random_control_halves_the_patch_tokens_where_it_runs():
    model = vitbench.apply(tiny_cait(), "random", keep=0.5, layers=(1, 2))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert reduction_context(model).token_counts == [64, 32, 16, 16]


def test_a_method_that_needs_the_attention_keys_is_refused():
    with pytest.raises(UnsupportedError, match="needs keys, which the 'cait' family"):
        vitbench.apply(tiny_cait(), "tome")
