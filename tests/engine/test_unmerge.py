"""Source tracking and unmerge (docs/methods.md §0): the full token grid comes back."""
from __future__ import annotations

import torch

import vitbench
from vitbench.engine import Reducer, enable_source_tracing, last_state, unmerge
from vitbench.testing import tiny_vit


def test_tome_unmerge_restores_every_position_from_its_token():
    model = vitbench.apply(tiny_vit(), "tome", r=8, trace_source=True)
    with torch.inference_mode():
        x = model.forward_features(torch.randn(2, 3, 32, 32))
    state = last_state(model)
    full = unmerge(x, state)
    assert full.shape == (2, 65, x.shape[-1])
    assert torch.equal(state.source.sum(-1, keepdim=True), state.size)  # sources agree with sizes
    for b in range(2):
        for t in range(x.shape[1]):
            covered = state.source[b, t].nonzero().flatten()
            assert torch.equal(full[b, covered], x[b, t].expand(len(covered), -1))


def test_pruned_positions_get_their_last_value():
    model = enable_source_tracing(vitbench.apply(tiny_vit(), "topk", keep=0.5, layers=(2,)))
    captured = {}
    block = model.blocks[2]
    real_reducer = block.reducer

    class Spy(Reducer):
        def __call__(self, x, state, info):
            captured["x"] = x.clone()
            return real_reducer(x, state, info)

    block.reducer = Spy()
    with torch.inference_mode():
        x = model.forward_features(torch.randn(2, 3, 32, 32))
    state = last_state(model)
    full = unmerge(x, state)
    kept = state.source.sum(1) > 0  # [B, N0]
    assert int((~kept).sum()) == 2 * 32
    assert torch.equal(full[~kept], captured["x"][~kept])


def test_identity_when_nothing_is_reduced():
    model = vitbench.apply(tiny_vit(), "tome", r=0, trace_source=True)
    with torch.inference_mode():
        x = model.forward_features(torch.randn(1, 3, 32, 32))
    assert torch.equal(unmerge(x, last_state(model)), x)
