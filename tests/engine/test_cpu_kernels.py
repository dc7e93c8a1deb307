"""ToMe's matching and merge as numba loops (vitbench/engine/cpu_kernels.py) equal the tensor
path, and are used only where nothing needs the tensor operations (issue 23, item 5)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitbench
from vitbench.engine import bipartite_soft_matching, cpu_kernels


def test_numba_compiles_them():
    assert cpu_kernels.warm()  # numba is a dependency: where it does not import, this fails


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each call of the matching loop returned a matching (spied on)."""
    calls: list[bool] = []
    real = cpu_kernels.match

    def spy(*args):  # type: ignore[no-untyped-def]
        found = real(*args)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(cpu_kernels, "match", spy)
    return calls


def _both(metric: torch.Tensor, x: torch.Tensor, size: torch.Tensor, r: int, prefix: int, calls: list[bool]):
    """(matching, merged) by the kernels and by the tensor path."""
    seen = len(calls)
    fast = bipartite_soft_matching(metric, r, prefix)
    assert calls[seen:] == [True]  # the kernels took it
    with cpu_kernels.enabled(False):
        slow = bipartite_soft_matching(metric, r, prefix)
        slow_out = slow.weighted_merge(x, size)
    return fast, fast.weighted_merge(x, size), slow, slow_out


def _assert_same_matching(fast, slow) -> None:
    for name in ("unm_idx", "src_idx", "dst_idx"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert (fast.prefix, fast.a_start) == (slow.prefix, slow.a_start)


@pytest.mark.parametrize("prefix", [0, 1, 2, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_kernels_equal_the_tensor_path(prefix, batch, kernel_calls):
    torch.manual_seed(10 * prefix + batch)
    with torch.inference_mode():
        for n in (prefix + 2, prefix + 3, 50, 51, 197):
            for r in (0, 1, 13, n):  # r above (N - prefix) // 2 is capped
                metric, x = torch.randn(batch, n, 16), torch.randn(batch, n, 24)
                size = torch.rand(batch, n, 1) * 3 + 1
                fast, (x_fast, s_fast), slow, (x_slow, s_slow) = _both(metric, x, size, r, prefix, kernel_calls)
                _assert_same_matching(fast, slow)
                assert x_fast.shape == x_slow.shape == (batch, n - slow.r, 24)
                assert torch.allclose(x_fast, x_slow, rtol=1e-6, atol=1e-6) and torch.equal(s_fast, s_slow)


def test_ties_go_to_the_first_token_as_in_the_tensor_path(kernel_calls):
    torch.manual_seed(0)
    metric = torch.randn(1, 41, 8).round()  # few distinct rows: many exactly equal similarities
    metric[:, 1:] = metric[:, 1:2]  # every patch the same: all similarities equal
    x, size = torch.randn(1, 41, 4), torch.ones(1, 41, 1)
    with torch.inference_mode():
        fast, _, slow, _ = _both(metric, x, size, 12, 1, kernel_calls)
    _assert_same_matching(fast, slow)


def test_a_zero_or_non_finite_key_leaves_it_to_the_tensor_path(kernel_calls):
    metric = torch.randn(1, 21, 8)
    metric[0, 5] = 0.0
    with torch.inference_mode():
        assert cpu_kernels.match(metric, 4, 1) is None
        m = bipartite_soft_matching(metric, 4, 1)
        metric[0, 5] = float("nan")
        assert cpu_kernels.match(metric, 4, 1) is None
    assert kernel_calls == [False, False, False] and m.r == 4  # the loop declined; the tensor path matched


def test_used_only_at_small_batches_where_nothing_needs_the_tensor_ops():
    x = torch.randn(1, 9, 4)
    assert cpu_kernels.usable(x)
    assert not cpu_kernels.usable(x.double()) and not cpu_kernels.usable(x.half())
    assert not cpu_kernels.usable(x.expand(cpu_kernels.MAX_BATCH + 1, -1, -1))  # threaded ops win there
    w = x.clone().requires_grad_()
    assert not cpu_kernels.usable(w)  # autograd tracks it
    with torch.no_grad():
        assert cpu_kernels.usable(w)
    with FlopCounterMode(display=False):  # GMACs count the tensor operations
        assert not cpu_kernels.usable(x)
    with cpu_kernels.enabled(False):
        assert not cpu_kernels.usable(x)
    assert cpu_kernels.usable(x)


def test_gradients_still_flow_through_the_tensor_merge(kernel_calls):
    torch.manual_seed(0)
    x = torch.randn(1, 21, 8, requires_grad=True)
    m = bipartite_soft_matching(torch.randn(1, 21, 4), 5, 1)  # the kernels match (no gradient there)
    assert kernel_calls == [True]
    out, _ = m.weighted_merge(x, torch.ones(1, 21, 1))  # but the merge is the tensor path's
    out.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("method,params", [("tome", {"r": 8}), ("ppt", {}), ("tome", {"r": 8, "prop_attn": False})])
def test_reduced_vit_logits_equal_with_and_without_the_kernels(method, params):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    base = VisionTransformer(img_size=64, patch_size=8, embed_dim=64, depth=12, num_heads=2, num_classes=10).eval()
    model = vitbench.apply(copy.deepcopy(base), method, **params).eval()
    images = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        fast = torch.cat([model(images[i : i + 1]) for i in range(2)])
        fast_batch = model(images)
        with cpu_kernels.enabled(False):
            slow = model(images)
    assert torch.allclose(fast, slow, atol=1e-5) and torch.allclose(fast_batch, slow, atol=1e-5)


def test_the_environment_variable_switches_them_off():
    code = ("import torch; from vitbench.engine import cpu_kernels; "
            "print(cpu_kernels.usable(torch.randn(1, 9, 4)) is False, cpu_kernels.describe())")
    env = {**os.environ, "VITBENCH_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True off (VITBENCH_CPU_KERNELS=0)"


def test_compiling_reads_no_kernel_state(monkeypatch):
    """Compiled, ``usable`` answers before it reads the switch: a graph compiled before the
    switch was first read is not compiled again once it has been (no guard on it)."""
    from torch._dynamo.testing import CompileCounter

    monkeypatch.setattr(cpu_kernels, "_ON", None)
    torch._dynamo.reset()
    counter = CompileCounter()
    matched = torch.compile(lambda m: bipartite_soft_matching(m, 4, 1).src_idx, backend=counter)
    metric = torch.randn(1, 17, 8)
    with torch.inference_mode():
        first = matched(metric)
        assert cpu_kernels.usable(metric)  # eager: reads the switch
        assert torch.equal(matched(metric), first)
    assert counter.frame_count == 1
