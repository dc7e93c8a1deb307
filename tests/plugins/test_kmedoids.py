"""K-Medoids clustering merge (plugins/kmedoids/)."""
from __future__ import annotations

import pytest
import torch

from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench_plugins.kmedoids import KMedoidsParams
from vitbench_plugins.kmedoids.reduction import kmedoids


def test_two_groups_are_found_from_the_even_start():
    """Three tokens near 0 then three near 10: the even start (tokens 0 and 5) already splits
    them; the medoids move to each group's middle member."""
    pts = torch.tensor([0.0, 0.1, 0.3, 10.0, 10.2, 10.3])
    x = torch.stack([pts, torch.zeros(6)], dim=-1)[None]
    assign, medoids = kmedoids(x, 2, iters=3)
    assert assign[0].tolist() == [0, 0, 0, 1, 1, 1]
    assert medoids[0].tolist() == [1, 4]


def test_iterations_move_a_bad_start():
    """Tokens [0, 10, 10.1, 10.2, 0.1]: the even start takes tokens 0 and 4, both near 0, so
    without iterations the far group joins token 4; the iterations move that medoid into the far
    group (token 2, its middle) and separate the two groups."""
    pts = torch.tensor([0.0, 10.0, 10.1, 10.2, 0.1])
    x = torch.stack([pts, torch.zeros(5)], dim=-1)[None]
    start, medoids0 = kmedoids(x, 2, iters=0)
    assert medoids0[0].tolist() == [0, 4] and start[0].tolist() == [0, 1, 1, 1, 1]
    assign, medoids = kmedoids(x, 2, iters=3)
    assert medoids[0].tolist() == [0, 2] and assign[0].tolist() == [0, 1, 1, 1, 0]


def test_deterministic_and_each_medoid_in_its_own_cluster():
    x = torch.randn(2, 30, 8, generator=torch.Generator().manual_seed(0))
    a1, m1 = kmedoids(x, 7, iters=3)
    a2, m2 = kmedoids(x, 7, iters=3)
    assert torch.equal(a1, a2) and torch.equal(m1, m2)
    for b in range(2):
        assert [a1[b, int(m)].item() for m in m1[b]] == list(range(7))
        assert sorted(set(a1[b].tolist())) == list(range(7))


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0.0}, "kmedoids.keep=0.0 is out of range"),
    ({"iters": -1}, "kmedoids.iters=-1 is out of range"),
    ({"layers": (-2,)}, "every item must be >= 0"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("kmedoids", KMedoidsParams, kwargs)  # what the command line, the plan and apply go through
