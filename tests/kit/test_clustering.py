"""The clustering merge (vitbench/kit/clustering.py): ``ceil(keep * N_p)`` size-weighted clusters."""
from __future__ import annotations

import torch

from vitbench.engine import AttnInfo, Reducer, TokenState
from vitbench.kit import ClusterMergeReducer, token_distances


def _pairs(x: torch.Tensor, clusters: int) -> torch.Tensor:
    """Patch ``i`` into cluster ``i // 2``."""
    return (torch.arange(x.shape[1]) // 2).expand(x.shape[0], -1)


def test_distances_are_scaled_by_the_width():
    x = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]])
    assert token_distances(x).tolist() == [[[0.0, 1.0], [1.0, 0.0]]]


def test_merges_into_the_given_clusters_behind_the_prefix():
    reducer = ClusterMergeReducer(0.5, _pairs)
    assert isinstance(reducer, Reducer)
    x = torch.arange(5.0).reshape(1, 5, 1)  # a prefix token, then patches 1 2 3 4
    state = TokenState(prefix=1)
    out = reducer(x, state, AttnInfo())
    assert out.flatten().tolist() == [0.0, 1.5, 3.5]
    assert state.size.flatten().tolist() == [1.0, 2.0, 2.0]


def test_keeping_every_token_changes_nothing():
    x = torch.randn(2, 5, 3)
    assert ClusterMergeReducer(1.0, _pairs)(x, TokenState(prefix=1), AttnInfo()) is x
