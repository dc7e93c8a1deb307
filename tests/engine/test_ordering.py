"""Scores from highest to lowest, ties by position (vitbench/engine/ordering.py): the integer
keys used when compiled for a CPU give the stable sort's order exactly (issue 23, item 5)."""
from __future__ import annotations

import pytest
import torch

from vitbench.engine.ordering import _by_integer_keys, descending_order


def _stable(scores: torch.Tensor) -> torch.Tensor:
    return scores.argsort(dim=-1, descending=True, stable=True)


def _with_ties(n: int, seed: int) -> torch.Tensor:
    """``[3, n]`` scores where every third one repeats another (a blank background's patches)."""
    scores = torch.randn(3, n, generator=torch.Generator().manual_seed(seed))
    if n > 1:
        scores[:, ::3] = scores[:, 1:2]
    return scores


@pytest.mark.parametrize("n", [1, 2, 7, 98, 300])
def test_integer_keys_give_the_stable_order(n):
    for seed in range(5):
        scores = _with_ties(n, seed)
        assert torch.equal(_by_integer_keys(scores), _stable(scores))


def test_integer_keys_rank_signed_zeros_infinities_and_nans_as_sort_does():
    negative_nan = torch.tensor([-4194304], dtype=torch.int32).view(torch.float32)[0]  # sign bit set
    scores = torch.tensor([[1.0, -0.0, 0.0, float("inf"), float("-inf"), float("nan"), -0.0, 2.0, 0.0]])
    scores[0, 0] = negative_nan
    assert torch.isnan(scores[0, 0]) and scores[0, 0].view(torch.int32) < 0
    assert torch.equal(_by_integer_keys(scores), _stable(scores))


def test_compiled_on_a_cpu_it_takes_the_integer_keys_and_keeps_the_order(monkeypatch):
    calls: list[int] = []
    real = _by_integer_keys

    def spy(scores: torch.Tensor) -> torch.Tensor:
        calls.append(scores.shape[-1])
        return real(scores)

    monkeypatch.setattr("vitbench.engine.ordering._by_integer_keys", spy)
    scores = _with_ties(98, 0)
    assert torch.equal(descending_order(scores), _stable(scores)) and calls == []  # eager: the stable sort
    torch._dynamo.reset()
    compiled = torch.compile(descending_order, fullgraph=True)
    assert torch.equal(compiled(scores), _stable(scores)) and calls == [98]
    assert torch.equal(compiled(scores.double()), _stable(scores.double()))  # not float32: the stable sort
