"""MCTF (plugins/mctf/) against the paper's algorithm written out literally, token by token,
and against the official DeiT-S setting (mlvlab/MCTF, run/eval_deit_s_mctf*.sh: r=16 at the
start of blocks 1-11, none in block 0).

The literal oracle below computes, in plain Python: the received attention a_j (mean over heads
and queries), the attraction of Eq. 2 on the *raw* 1/a and 1/s (no normalisation by the image's
largest value: that normalisation is one constant factor per image and must change no choice),
the bidirectional matching (step 1 A -> B, step 2 B -> the A tokens left, step 2 on the step-1
attraction), and the fusion sum(a s x) / sum(a s) over each group, step-1 members chained into
their step-2 destination. A side-by-side run of the official ``bipartite_soft_matching`` +
``merge_wavg(pooling_type=1)`` on 8000 random cases gave the same groups, fused values (fp64,
1e-9) and sizes as the reducer (docs: /tmp/vb-pending/fidelity-mctf.md)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench_plugins.mctf.reduction import MCTFReducer, Temperatures

pytestmark = pytest.mark.usefixtures("single_thread")


def _literal_mctf(x: list[list[float]], attn: list[list[list[float]]], size: list[float], r: int,
                  taus: tuple[float, float, float], bidirectional: bool):
    """One image, one class token at position 0. Returns the output tokens as
    ``[(sorted member positions, fused vector, size)]`` in the output order (prefix, the A tokens
    left, the B tokens left, each in original order)."""
    n, heads = len(x), len(attn)
    received = [sum(attn[h][q][j] for h in range(heads) for q in range(n)) / (heads * n) for j in range(n)]
    tau_sim, tau_info, tau_size = taus

    def cos(i: int, j: int) -> float:
        dot = sum(u * v for u, v in zip(x[i], x[j]))
        return dot / (math.sqrt(sum(u * u for u in x[i])) * math.sqrt(sum(v * v for v in x[j])))

    def w(i: int, j: int) -> float:
        value = 1.0
        if tau_sim:
            value *= ((cos(i, j) + 1) / 2) ** (1 / tau_sim)
        if tau_info:
            value *= (1 / received[i] / received[j]) ** (1 / tau_info)
        if tau_size:
            value *= (1 / size[i] / size[j]) ** (1 / tau_size)
        return value

    set_a = [i for i in range(1, n) if i % 2 == 0]  # even absolute positions, as the official code
    set_b = [j for j in range(1, n) if j % 2 == 1]
    r1 = r // 2 if bidirectional else r
    members = {t: [t] for t in range(1, n)}
    best_b = {i: max(set_b, key=lambda j: w(i, j)) for i in set_a}
    fused_a = sorted(set_a, key=lambda i: -w(i, best_b[i]))[:r1]
    for i in fused_a:
        members[best_b[i]] += members.pop(i)
    left_a = [i for i in set_a if i not in fused_a]
    best_a = {j: max(left_a, key=lambda i: w(i, j)) for j in set_b}
    fused_b = sorted(set_b, key=lambda j: -w(best_a[j], j))[:r - r1]
    for j in fused_b:
        members[best_a[j]] += members.pop(j)
    order = [0] + left_a + [j for j in set_b if j not in fused_b]
    members[0] = [0]
    out = []
    for t in order:
        group = members[t]
        weights = [received[m] * size[m] for m in group]
        vector = [sum(wt * x[m][c] for wt, m in zip(weights, group)) / sum(weights) for c in range(len(x[0]))]
        out.append((sorted(group), vector, sum(size[m] for m in group)))
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("r, bidirectional", [(1, True), (4, True), (7, True), (10, True), (5, False)])
@pytest.mark.parametrize("taus", [(1.0, 20.0, 40.0), (1.0, 1.0, 1.0), (2.0, 3.0, 0.0)])
def test_reducer_equals_the_literal_algorithm(seed, r, bidirectional, taus):
    """Groups (by traced sources), order, fused values and sizes, on a class token + 21 patches
    with random tokens, attention and sizes."""
    g = torch.Generator().manual_seed(seed)
    n, c, heads = 22, 8, 3
    x = torch.randn(1, n, c, generator=g, dtype=torch.float64)
    attn = (2 * torch.randn(1, heads, n, n, generator=g, dtype=torch.float64)).softmax(dim=-1)
    size = torch.randint(1, 5, (1, n, 1), generator=g).double()
    size[:, 0] = 1.0
    state = TokenState.start(x, prefix=1, trace_source=True)
    state.size = size.clone()
    out = MCTFReducer(r, Temperatures(*taus), bidirectional)(x, state, AttnInfo(attn=attn))

    expected = _literal_mctf(x[0].tolist(), attn[0].tolist(), size[0, :, 0].tolist(), r, taus, bidirectional)
    assert out.shape == (1, n - r, c)
    for k, (group, vector, group_size) in enumerate(expected):
        assert torch.nonzero(state.source[0, k]).flatten().tolist() == group
        assert out[0, k].tolist() == pytest.approx(vector, rel=1e-9, abs=1e-12)
        assert state.size[0, k, 0].item() == group_size


def test_step_two_fuses_the_chained_group_by_attention_and_size():
    """Bidirectional r=2 on a class token + 6 patches: b0 (position 1) is step 1's destination
    of a0 (position 2) and then fuses into a1 (position 4) in step 2; the output token is
    sum(a s x) / sum(a s) over all three, not a mean of means."""
    x = torch.zeros(1, 7, 3)
    x[0, 1] = torch.tensor([1.0, 0.0, 0.0])
    x[0, 2] = torch.tensor([1.0, 0.05, 0.0])   # a0: nearest to b0 -> step 1
    x[0, 4] = torch.tensor([1.0, -0.1, 0.0])   # a1: the A token b0 (with a0) likes best -> step 2
    x[0, 3] = torch.tensor([0.0, 1.0, 0.0])
    x[0, 5] = torch.tensor([0.0, 0.0, 1.0])
    x[0, 6] = torch.tensor([0.0, -1.0, 1.0])
    x[0, 0] = torch.tensor([5.0, 5.0, 5.0])
    received = torch.tensor([0.4, 0.2, 0.05, 0.1, 0.1, 0.1, 0.05])
    attn = received.expand(1, 2, 7, 7).clone()
    size = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0])
    state = TokenState.start(x, prefix=1, trace_source=True)
    state.size = size[None, :, None].clone()
    out = MCTFReducer(2, Temperatures(1.0, 0.0, 0.0), bidirectional=True)(x, state, AttnInfo(attn=attn))
    group = [1, 2, 4]
    w = (received * size)[group]
    expected = (w[:, None] * x[0, group]).sum(0) / w.sum()
    # layout: cls, A left (a1 = position 4 holding the group, a2 = position 6), B left (3, 5)
    assert torch.nonzero(state.source[0, 1]).flatten().tolist() == group
    assert torch.allclose(out[0, 1], expected, atol=1e-6)
    assert state.size[0, :, 0].tolist() == [1.0, 6.0, 1.0, 1.0, 1.0]


def test_the_official_deit_s_setting_as_a_per_block_list(deit_small):
    """The official DeiT-S setting fuses r=16 at the start of blocks 1-11 with that block's
    attention on its input; in vitbench that is ``r=[0] + [16] * 11`` (block l fuses after its
    own attention): 197 tokens in block 0, then 181 ... 21, as the official code, and 2.66
    GMACs (the official fvcore count, 2.60 G, also runs attention @ V, the value and the output
    projections of blocks 1-11 on the fused tokens: 0.067 G less)."""
    from vitbench.measure import count_gmacs_at

    model = vitbench.apply(copy.deepcopy(deit_small), "mctf", r=[0] + [16] * 11)
    with torch.inference_mode():
        model(torch.randn(1, 3, 224, 224))
    assert reduction_context(model).token_counts == [197 - 16 * k for k in range(12)]
    assert count_gmacs_at(model).mean == pytest.approx(2.66, abs=0.005)
