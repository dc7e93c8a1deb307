"""topk keeps the pruned tokens in original order where EViT's code sorts them by score: the
layout cannot change its outputs, because no later step of topk depends on token positions
(plugins/topk/; docs/methods.md §4). These tests hold vitbench to that claim."""
from __future__ import annotations

import functools

import pytest
import torch

import vitbench
import vitbench_plugins.topk.reduction as topk
from vitbench.engine import enable_source_tracing, last_state, reduction_context
from vitbench.testing import tiny_vit
from tests_support import sharp_vit as _sharp_vit  # tests/tests_support.py
from vitbench.kit import top_tokens




@pytest.mark.parametrize("params", [dict(keep=0.7), dict(keep=0.5, fuse=True),
                                    dict(keep=0.6, layers=(1, 2, 5, 8), score="entropy", fuse=True),
                                    dict(keep=0.7, layers=(1, 4))])
def test_score_order_gives_the_same_logits_and_counts(monkeypatch, params):
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    kept = enable_source_tracing(vitbench.apply(_sharp_vit(), "topk", **params))
    with torch.inference_mode():
        by_position = kept(images)
    counts, sources = reduction_context(kept).token_counts, last_state(kept).source
    monkeypatch.setattr(topk, "top_tokens", functools.partial(top_tokens, order="score"))
    sorted_model = enable_source_tracing(vitbench.apply(_sharp_vit(), "topk", **params))
    with torch.inference_mode():
        by_score = sorted_model(images)
    assert not torch.equal(last_state(sorted_model).source, sources)  # the layouts do differ
    assert torch.equal(last_state(sorted_model).source.sum(dim=1), sources.sum(dim=1))  # same tokens
    assert reduction_context(sorted_model).token_counts == counts
    assert (by_score - by_position).abs().max() < 1e-5


def test_avg_pool_model_is_order_free_too(monkeypatch):
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    make = lambda: vitbench.apply(tiny_vit(class_token=False, global_pool="avg"), "topk", keep=0.5,
                                  score="entropy", fuse=True)  # noqa: E731
    with torch.inference_mode():
        by_position = make()(images)
        monkeypatch.setattr(topk, "top_tokens", functools.partial(top_tokens, order="score"))
        by_score = make()(images)
    assert (by_score - by_position).abs().max() < 1e-5
