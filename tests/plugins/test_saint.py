"""SAINT (plugins/saint/): equal to its official code on the same inputs, a hand-made vote, its
registration and the conformance check.

``data/saint_official.pt`` holds what the official code (ArmenJeddi/saint at baaff95, ``ViT/saint``;
``apply_patch(model, 0.75, 5, 10.0)`` and ``prune_mode = ['drop'] * 6`` as its ``example_timm.py``
sets them) gave on the embedded default model for the first 8 Fashion-MNIST test images: the
normalised inputs, the logits and the tokens after every block. It was made by running that code
beside vitbench in a scratch folder (docs/methods.md, "SAINT", says how)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vitbench
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.host import get_host
from vitbench.tasks.models import load_model
from vitbench_plugins.saint.reduction import SaintReducer, kept_index

REFERENCE = Path(__file__).parent / "data" / "saint_official.pt"


def test_the_default_model_gives_the_official_codes_tokens_and_logits():
    ref = torch.load(REFERENCE, weights_only=True)
    model = vitbench.apply(load_model("vitbench-fmnist-deit"), "saint")
    counts: list[int] = []
    for blk in model.blocks:
        blk.register_forward_hook(lambda m, a, out: counts.append(out.shape[1]))
    with torch.inference_mode():
        logits = model(ref["input"])
    assert counts == list(ref["counts"])
    assert counts[0] < 197 and counts[5] < counts[4] and counts[6:] == [counts[5]] * 6  # drops in blocks 0-5 only
    assert torch.allclose(logits, ref["logits"], atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), ref["logits"].argmax(-1))


def _keys(vectors: list[list[float]]) -> torch.Tensor:
    return torch.tensor(vectors, dtype=torch.float64)[None]


#: cls + 6 patches: sources are patches 0, 2, 4 (positions 1, 3, 5), destinations 1, 3, 5 (2, 4, 6)
HAND_MADE = [[9, 9, 9], [1, 0, 0], [1, 0.05, 0], [0, 1, 0], [1, 0, 0.08], [0, 0, 1], [1, 0.02, 0.02]]


def test_a_source_with_k_close_destinations_is_dropped_and_the_order_is_the_official_one():
    """Source 0 is within 0.9 of every destination (3 edges, k=2: a vote); sources 2 and 4 have
    no edge and rank by their mean similarity (0.033 for source 4, 0.023 for source 2). One vote
    in one image: r = 1, source 0 (position 1) goes; the kept sources come most redundant first
    (position 5, then 3), then every destination in order."""
    index = kept_index(_keys(HAND_MADE), 1, threshold=0.9, k=2, gamma=10.0)
    assert index.tolist() == [[0, 5, 3, 2, 4, 6]]
    assert kept_index(_keys(HAND_MADE), 1, threshold=0.9, k=4, gamma=10.0) is None  # nobody has 4 edges


def test_the_rate_is_the_batchs_mean_vote():
    """Image A's four sources each have four close destinations (4 votes), image B's sources are
    orthogonal to its destinations (0 votes): r = int((4 + 0) / 2) = 2 sources dropped in each."""
    same = [[1.0, 0.0]] * 9
    apart = [[1.0, 0.0]] + [[0.0, 1.0], [1.0, 0.0]] * 4
    index = kept_index(torch.tensor([same, apart], dtype=torch.float64), 1, threshold=0.9, k=1, gamma=1.0)
    assert index.shape == (2, 9 - 2)


def test_a_reducer_keeps_the_state_in_step():
    x = torch.randn(1, 7, 3, dtype=torch.float64)
    state = TokenState(prefix=1)
    out = SaintReducer(0.9, 2, 10.0)(x, state, AttnInfo(keys=_keys(HAND_MADE)))
    assert torch.equal(out, x[:, [0, 5, 3, 2, 4, 6]])


def test_registration_and_where_it_runs():
    host = get_host()
    spec = host.method("saint")
    assert (spec.kind, spec.needs, spec.needs_training) == ("pruning", {"token_steps", "keys"}, False)
    assert (spec.budget.param, spec.budget.larger_means) == ("threshold", "more")
    assert host.families_for(spec) == ["mobilevit", "swin", "vit"]
    defaults = spec.params()
    assert (defaults.threshold, defaults.k, defaults.gamma, defaults.layers) == (0.75, 5, 10.0, None)
    reduction = reduction_context(vitbench.apply(load_model("vitbench-fmnist-deit"), "saint")).reduction
    assert [r is not None for r in reduction.reducers] == [True] * 6 + [False] * 6


@pytest.mark.parametrize("bad", [{"threshold": 1.5}, {"k": 0}, {"gamma": -1.0}, {"layers": (-1,)}])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(vitbench.errors.ParamError, match="saint"):
        vitbench.apply(load_model("vitbench-fmnist-deit"), "saint", **bad)


def test_it_passes_the_conformance_check(vitbench_check_method):
    vitbench_check_method("saint", {"threshold": 0.0, "k": 1})
