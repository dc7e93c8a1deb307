"""Sinkhorn token clustering (plugins/sinkhorn/; Haurum et al., ICCV Workshops 2023, §3) and the
soft merge it uses (vitbench/kit/soft_merge.py)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import vitbench
from vitbench.engine import TokenState
from vitbench_plugins.vit_family.adapter import describe
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench.kit import soft_cluster
from vitbench_plugins.sinkhorn import SinkhornParams
from vitbench_plugins.sinkhorn.reduction import SinkhornReducer, build, site_counts, sinkhorn


def _scaling_sinkhorn(kernel: torch.Tensor, iters: int) -> torch.Tensor:
    """Sinkhorn-Knopp in the scaling form (Cuturi 2013), one image: ``v = b / K^T u``, then
    ``u = a / K v``, from ``u = 1``; ``diag(u) K diag(v)``."""
    n, m = kernel.shape
    a, b = torch.full((n,), 1 / n, dtype=kernel.dtype), torch.full((m,), 1 / m, dtype=kernel.dtype)
    u = torch.ones(n, dtype=kernel.dtype)
    for _ in range(iters):
        v = b / (kernel.T @ u)
        u = a / (kernel @ v)
    return u[:, None] * kernel * v[None, :]


@pytest.mark.parametrize("iters", [1, 3, 50])
def test_the_plan_is_sinkhorn_knopps(iters):
    log_kernel = torch.randn(2, 12, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(iters))
    plan = sinkhorn(log_kernel, iters)
    for b in range(2):
        assert torch.allclose(plan[b], _scaling_sinkhorn(log_kernel[b].exp(), iters), atol=1e-12)


def test_the_plan_meets_the_marginals():
    """Rows (tokens) sum to ``1/N`` exactly after every iteration; columns (centres) to ``1/M``
    once converged."""
    plan = sinkhorn(torch.randn(3, 40, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), 200)
    assert torch.allclose(plan.sum(dim=2), torch.full((3, 40), 1 / 40, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(plan.sum(dim=1), torch.full((3, 8), 1 / 8, dtype=torch.float64), atol=1e-9)


def test_two_tokens_on_their_own_centres_by_hand():
    """Tokens ``e1, e2``, centres ``e1, e2``, ``eps = 1``: the log-kernel is the identity, one
    iteration is exact, and each token gives ``e/(1+e)`` to its own centre, ``1/(1+e)`` to the other."""
    reducer = SinkhornReducer(2, 2, eps=1.0, iters=1, seed=0)
    with torch.no_grad():
        reducer.centres.copy_(torch.eye(2))
    own = math.e / (1 + math.e)
    shares = reducer.shares(torch.eye(2)[None])
    assert torch.allclose(shares[0], torch.tensor([[own, 1 - own], [1 - own, own]]), atol=1e-6)
    x = torch.tensor([[[5.0, 5.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # cls + 3 patches: 2 centres
    state = TokenState.start(x, prefix=1)
    out = reducer(x, state, None)
    assert out.shape == (1, 3, 2) and out[0, 0].tolist() == [5.0, 5.0]
    assert torch.allclose(state.size[0, 1:].sum(), torch.tensor(3.0))


def test_one_hot_shares_are_the_hard_cluster():
    x = torch.randn(2, 7, 4, generator=torch.Generator().manual_seed(0))
    assign = torch.tensor([[0, 1, 1, 2, 0, 2], [2, 2, 1, 0, 0, 1]])
    hard = TokenState.start(x, prefix=1, trace_source=True)
    hard.size = torch.rand(2, 7, 1, generator=torch.Generator().manual_seed(1)) + 1
    soft = TokenState.start(x, prefix=1, trace_source=True)
    soft.size = hard.size.clone()
    expected = hard.cluster(x, assign, 3)
    got = soft_cluster(x, soft, torch.nn.functional.one_hot(assign, 3).float())
    assert torch.allclose(got, expected, atol=1e-6)
    assert torch.allclose(soft.size, hard.size) and torch.allclose(soft.source, hard.source)


def test_site_counts():
    assert site_counts(0.5, 3, 196) == [98, 49, 25]
    assert site_counts(0.7, 3, 64) == [45, 32, 23]


def test_token_counts_sizes_and_keep_one(vit):
    """test_vit: 100 patches + class token, 6 blocks; keep 0.5 at blocks 1 and 3: 50 then 25
    centres; the shared sizes still add up to the 100 patches. ``keep = 1`` is the unpatched model."""
    x = torch.randn(2, 3, 160, 160)
    reduced = vitbench.apply(copy.deepcopy(vit), "sinkhorn", keep=0.5, layers=(1, 3))
    with torch.inference_mode():
        out = reduced(x)
        ctx = vitbench.engine.reduction_context(reduced)
        assert ctx.token_counts == [101, 51, 51, 26, 26, 26]
        assert torch.allclose(ctx.state.size[:, 1:].sum(dim=1), torch.full((2, 1), 100.0), atol=1e-3)
        assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()
        same = vitbench.apply(copy.deepcopy(vit), "sinkhorn", keep=1.0, layers=(1, 3))
        assert torch.equal(same(x), vit(x))


def test_the_centres_train(vit):
    """Only the centres are trained (a TrainStage on ``centres``), and the loss reaches them."""
    reduction = build(SinkhornParams(layers=(1, 3)), describe(vit))
    assert [s.trainable for s in reduction.train] == [("centres",)]
    reduced = vitbench.apply(copy.deepcopy(vit), "sinkhorn", keep=0.5, layers=(1, 3))
    reduced(torch.randn(2, 3, 160, 160)).logsumexp(dim=-1).sum().backward()
    grads = [m.centres.grad for m in reduced.modules() if isinstance(m, SinkhornReducer)]
    assert len(grads) == 2 and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0.0}, r"sinkhorn.keep=0.0 is out of range; it must be in \(0, 1\]"),
    ({"eps": 0.0}, "sinkhorn.eps=0.0 is out of range; it must be > 0"),
    ({"iters": 0}, "sinkhorn.iters=0 is out of range; it must be >= 1"),
    ({"layers": (3, 3)}, "each block may be listed once"),
    ({"layers": (-1,)}, "every item must be >= 0"),
    ({"lr": 0.0}, "sinkhorn.lr=0.0 is out of range"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("sinkhorn", SinkhornParams, kwargs)  # what the command line, the plan and apply go through
