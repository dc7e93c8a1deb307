"""TokenState (docs/token-state.md): reductions keep size and source in step, and the prefix
tokens (class / distillation / register) can be neither dropped, reordered nor merged."""
from __future__ import annotations

import pytest
import torch

from vitbench.engine import TokenState, bipartite_soft_matching
from vitbench.engine import PrefixTokenError  # the plugin kit exports it
from vitbench.errors import VitbenchError


def _tokens(b: int = 2, n: int = 9, c: int = 4) -> torch.Tensor:
    return torch.randn(b, n, c, generator=torch.Generator().manual_seed(0))


def _state(x: torch.Tensor, prefix: int, trace: bool = False) -> TokenState:
    return TokenState.start(x, prefix, trace_source=trace)


def test_keep_gathers_tokens_sizes_and_sources_in_the_given_order() -> None:
    x = _tokens()
    state = _state(x, prefix=2, trace=True)
    state.size = torch.arange(1.0, 10.0).expand(2, 9)[..., None].clone()
    index = torch.tensor([[0, 1, 7, 3], [0, 1, 2, 8]])  # patches in any order (PPT: by score)
    kept = state.keep(x, index)
    assert torch.equal(kept, torch.stack([x[0, [0, 1, 7, 3]], x[1, [0, 1, 2, 8]]]))
    assert state.size[..., 0].tolist() == [[1.0, 2.0, 8.0, 4.0], [1.0, 2.0, 3.0, 9.0]]
    assert torch.equal(state.source.argmax(-1), index)
    # a pruned patch's last value is filled in for unmerge; the prefix is never pruned
    assert torch.equal(state.fill[0, 4], x[0, 4]) and torch.equal(state.fill[0, 0], torch.zeros(4))


@pytest.mark.parametrize("index, message", [
    ([[1, 2, 3], [0, 2, 3]], r"drops prefix token\(s\) \[0\] for image 0; every row must start with "
                             r"the 1 prefix token\(s\) \[0\] in that order"),
    ([[0, 2, 3], [3, 2, 1]], r"drops prefix token\(s\) \[0\] for image 1"),
])
def test_keep_rejects_an_index_that_drops_the_class_token(index, message) -> None:
    x = _tokens()
    with pytest.raises(PrefixTokenError, match=message):
        _state(x, prefix=1).keep(x, torch.tensor(index))


@pytest.mark.parametrize("index, message", [
    ([[1, 0, 2, 3]] * 2, r"reorders the prefix tokens \(its row starts \[1, 0\]\) for image 0; every row "
                         r"must start with the 2 prefix token\(s\) \[0, 1\] in that order"),
    ([[0, 2, 1, 3]] * 2, r"reorders the prefix tokens \(its row starts \[0, 2\]\)"),
    ([[0, 3, 4, 5]] * 2, r"drops prefix token\(s\) \[1\] for image 0"),
    ([[0]] * 2, r"index of shape \(2, 1\) cannot hold the 2 prefix token\(s\); .* starting \[0, 1\]"),
])
def test_keep_rejects_an_index_that_swaps_or_drops_cls_and_dist(index, message) -> None:
    x = _tokens()
    with pytest.raises(PrefixTokenError, match=message) as info:
        _state(x, prefix=2).keep(x, torch.tensor(index))
    assert isinstance(info.value, VitbenchError)


def test_keep_without_prefix_tokens_accepts_any_order() -> None:
    x = _tokens()
    index = torch.tensor([[5, 0, 3], [8, 7, 6]])
    assert torch.equal(_state(x, prefix=0).keep(x, index)[1], x[1, [8, 7, 6]])


def test_merge_leaves_the_prefix_first_and_untouched() -> None:
    x = _tokens(n=11)
    state = _state(x, prefix=3)
    merged = state.merge(x, bipartite_soft_matching(x, 3, 3))
    assert merged.shape == (2, 8, 4)
    assert torch.equal(merged[:, :3], x[:, :3]) and state.size[:, :3].eq(1).all()
    assert state.size.sum(1).flatten().tolist() == [11.0, 11.0]


def test_merge_rejects_a_matching_that_could_merge_a_prefix_token() -> None:
    x = _tokens(n=11)
    with pytest.raises(PrefixTokenError, match=r"the matching protects only the first 1 token\(s\) but the "
                                              r"model has 3 prefix token\(s\)"):
        _state(x, prefix=3).merge(x, bipartite_soft_matching(x, 2, 1))


def test_append_goes_after_the_prefix_and_the_patches() -> None:
    x = _tokens()
    state = _state(x, prefix=2)
    token = torch.ones(2, 1, 4)
    out = state.append(x, token, torch.full((2, 1, 1), 3.0))
    assert torch.equal(out[:, :9], x) and torch.equal(out[:, 9:], token)
    assert state.size[:, -1, 0].tolist() == [3.0, 3.0]
