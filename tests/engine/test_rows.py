"""Row gathers and adds (vitbench/engine/rows.py) equal gather/scatter_add, at batch 1 (its own
path) and above; a reduced model gives each image the same tokens and logits alone as in a batch."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.engine.rows import add_rows, take_rows
from vitbench.measure.limit import token_counts


def _expanded(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return index[..., None].expand(-1, -1, like.shape[-1])


@pytest.mark.parametrize("batch", [1, 3])
def test_take_rows_is_gather(batch):
    torch.manual_seed(batch)
    x = torch.randn(batch, 11, 5)
    index = torch.randint(0, 11, (batch, 7))
    assert torch.equal(take_rows(x, index), x.gather(1, _expanded(index, x)))
    strided = x[:, ::2]  # a view that is not contiguous
    index = torch.randint(0, strided.shape[1], (batch, 4))
    assert torch.equal(take_rows(strided, index), strided.gather(1, _expanded(index, strided)))


@pytest.mark.parametrize("batch", [1, 3])
def test_add_rows_is_scatter_add(batch):
    torch.manual_seed(batch)
    out = torch.randn(batch, 9, 4, dtype=torch.float64)
    index = torch.tensor([[2, 5, 2, 8]] * batch)  # row 2 named twice: it receives both
    src = torch.randn(batch, 4, 4, dtype=torch.float64)
    expected = out.scatter_add(1, _expanded(index, out), src)
    assert add_rows(out, index, src) is out
    assert torch.allclose(out, expected, atol=1e-12)


@pytest.mark.parametrize("method, params", [("tome", {"r": 8}), ("ppt", {"r": 10, "layers": (1, 3)}),
                                            ("topk", {"keep": 0.6, "layers": (1, 3)})])
def test_batch_1_gives_what_the_batch_gives(method, params):
    """The batch-1 paths (one index_select / index_add_ per step) and the batched ones agree:
    the same token counts and logits for every image alone as inside a batch of three."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    base = VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10).eval()
    model = vitbench.apply(copy.deepcopy(base), method, **params)
    images = torch.randn(3, 3, 32, 32)
    counts = token_counts(model, images)
    with torch.inference_mode():
        batched = model(images)
        for i in range(3):
            assert token_counts(model, images[i : i + 1]) == counts
            assert torch.allclose(model(images[i : i + 1]), batched[i : i + 1], atol=1e-5)
