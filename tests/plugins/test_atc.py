"""ATC, agglomerative token clustering (plugins/atc/; Haurum et al., ECCV 2024, §3)."""
from __future__ import annotations

import math

import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from vitbench_plugins.vit_family.adapter import describe
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench_plugins.atc import ATCParams
from vitbench_plugins.atc.reduction import agglomerative, build


def _at_angles(degrees: list[float]) -> torch.Tensor:
    """Unit vectors in the plane at these angles, ``[1, N, 2]``: their cosine distance grows
    with the angle between them, so single and complete linkage follow the angle gaps."""
    rad = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=-1)[None]


@pytest.mark.parametrize("method, expected", [
    # gaps 10, 11, 12, 13 degrees: single linkage chains the four first tokens before the last
    ("single", [0, 0, 0, 0, 1]),
    # complete: {0, 10} (10), {21, 33} (12), then {21, 33} + 46 (max 25) before {0, 10} + {21, 33} (33)
    ("complete", [0, 0, 1, 1, 1]),
    # average, in 1 - cos: {21, 33} + 46 (0.060) before {0, 10} + {21, 33} (0.081), worked by hand
    ("average", [0, 0, 1, 1, 1]),
])
def test_the_linkage_functions_by_hand(method, expected):
    assert agglomerative(_at_angles([0, 10, 21, 33, 46]), 2, method)[0].tolist() == expected


@pytest.mark.parametrize("method", ["average", "complete", "single"])
@pytest.mark.parametrize("clusters", [2, 7, 20])
def test_the_partition_is_scipys(method, clusters):
    """Against scipy's own route: pdist's cosine distance, then fcluster for ``clusters``."""
    x = torch.randn(3, 40, 16, generator=torch.Generator().manual_seed(clusters))
    assign = agglomerative(x, clusters, method)
    for b in range(3):
        ref = fcluster(linkage(pdist(x[b].double().numpy(), "cosine"), method=method), clusters, "maxclust")
        pairs = set(zip(ref.tolist(), assign[b].tolist()))
        assert len(pairs) == len(set(ref.tolist())) == len(set(assign[b].tolist())) == clusters


def test_clusters_are_numbered_by_their_first_token():
    x = torch.randn(2, 30, 8, generator=torch.Generator().manual_seed(1))
    for row in agglomerative(x, 6, "average"):
        firsts = [row.tolist().index(k) for k in range(6)]
        assert firsts == sorted(firsts)


def test_the_reducers_cluster_the_keys_at_the_listed_blocks(vit):
    reduction = build(ATCParams(keep=0.5, layers=(1, 3)), describe(vit))
    listed = [i for i, r in enumerate(reduction.reducers) if r is not None]
    assert listed == [1, 3] and all(reduction.reducers[i].needs == frozenset({"keys"}) for i in listed)
    assert reduction.prop_attn


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0.0}, r"atc.keep=0.0 is out of range; it must be in \(0, 1\]"),
    ({"keep": 1.5}, r"atc.keep=1.5 is out of range"),
    ({"linkage": "ward"}, "atc.linkage='ward'; valid values: average, complete, single"),
    ({"layers": (-1,)}, "every item must be >= 0"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("atc", ATCParams, kwargs)  # what the command line, the plan and apply go through
