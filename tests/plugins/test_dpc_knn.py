"""DPC-KNN clustering merge (plugins/dpc_knn/; TCFormer §3.2) and TokenState.cluster."""
from __future__ import annotations

import pytest
import torch

from vitbench.engine import TokenState
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench_plugins.dpc_knn import DPCKNNParams
from vitbench_plugins.dpc_knn.reduction import dpc_knn


def test_two_groups_and_their_centres():
    """Two tight groups far apart: two clusters, one per group, each centred on a member."""
    pts = torch.tensor([0.0, 0.1, 0.2, 10.0, 10.1, 10.3])
    x = torch.stack([pts, torch.zeros(6)], dim=-1)[None]  # [1, 6, 2]
    assign, centres = dpc_knn(x, 2, k=2)
    a = assign[0].tolist()
    assert a[0] == a[1] == a[2] != a[3] == a[4] == a[5]
    assert {int(c) < 3 for c in centres[0]} == {True, False}  # one centre in each group
    assert [a[int(c)] for c in centres[0]] == [0, 1]  # each centre in its own cluster


def test_density_ties_break_by_position():
    """Identical tokens (every distance 0): still deterministic, and each centre is its own
    cluster, so no cluster is empty."""
    x = torch.ones(1, 5, 3)
    assign, centres = dpc_knn(x, 2, k=2)
    assert [assign[0, int(c)].item() for c in centres[0]] == [0, 1]
    assert torch.equal(dpc_knn(x, 2, k=2)[0], assign) and torch.equal(dpc_knn(x, 2, k=2)[1], centres)


def test_cluster_is_the_size_weighted_mean_and_keeps_the_prefix():
    x = torch.tensor([[[9.0], [1.0], [2.0], [4.0], [8.0]]])  # cls + 4 patches
    state = TokenState.start(x, prefix=1, trace_source=True)
    state.size = torch.tensor([[[1.0], [1.0], [3.0], [1.0], [1.0]]])
    out = state.cluster(x, torch.tensor([[0, 0, 1, 1]]), 2)
    assert out[0, :, 0].tolist() == [9.0, (1 + 2 * 3) / 4, 6.0]
    assert state.size[0, :, 0].tolist() == [1.0, 4.0, 2.0]
    assert state.source[0].tolist() == [[1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]]


def test_cluster_refuses_an_empty_cluster_and_a_bad_assignment():
    x = torch.randn(1, 5, 2)
    with pytest.raises(ValueError, match="holds no patch token"):
        TokenState.start(x, prefix=1).cluster(x, torch.tensor([[0, 0, 0, 0]]), 2)
    with pytest.raises(ValueError, match=r"assign must be \[B, N - prefix\]"):
        TokenState.start(x, prefix=1).cluster(x, torch.tensor([[0, 1]]), 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0.0}, "dpc-knn.keep=0.0 is out of range"),
    ({"keep": 1.5}, "dpc-knn.keep=1.5 is out of range"),
    ({"k": 0}, "dpc-knn.k=0 is out of range"),
    ({"layers": (-1,)}, "every item must be >= 0"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("dpc-knn", DPCKNNParams, kwargs)  # what the command line, the plan and apply go through
