"""PatchMerger (plugins/patchmerger/): M learned queries merge the patches once, mid-network."""
from __future__ import annotations

import copy

import pytest
import torch

import vitbench
from vitbench.measure.calibrate import TOLERANCE
from vitbench.engine import TokenState, reduction_context
from vitbench.engine.attention import AttnInfo
from vitbench.core.params import make_params
from vitbench.errors import ParamError
from vitbench.host import get_host
from vitbench.testing import check_method, tiny_vit
from vitbench_plugins.patchmerger import PatchMergerParams
from vitbench_plugins.patchmerger.reduction import PatchMergerReducer

pytestmark = pytest.mark.usefixtures("single_thread")


def _mergers(model):
    return [m for m in model.modules() if isinstance(m, PatchMergerReducer)]


def test_registers_as_a_learnable_merging_method():
    spec = get_host().method("patchmerger")
    assert spec.kind == "merging" and spec.needs_training and get_host().families_for(spec) == ["vit"]
    assert spec.budget.param == "tokens" and spec.budget.larger_means == "more" and spec.budget.integer
    model = vitbench.apply(tiny_vit(), "patchmerger")
    assert [b.index for b in model.blocks if b.reducer is not None] == [5]  # 12 blocks: the middle
    assert all(b.fused for b in model.blocks) and not reduction_context(model).reduction.prop_attn
    stage = reduction_context(model).reduction.train[0]
    assert stage.optimizer == "AdamW" and stage.trainable is None and stage.epochs == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"tokens": 0}, r"patchmerger.tokens=0 is out of range; the output token count must be an integer >= 1"),
    ({"tokens": 2.5}, r"patchmerger.tokens=2.5 is not a valid int"),
    ({"layer": -1}, r"patchmerger.layer=-1 is out of range; it is a block index >= 0"),
    ({"epochs": 0}, r"patchmerger.epochs=0 is out of range; it must be >= 1"),
    ({"lr": 0.0}, r"patchmerger.lr=0.0 is out of range; it must be > 0"),
    ({"weight_decay": -1.0}, r"patchmerger.weight_decay=-1.0 is out of range; it must be >= 0"),
    ({"batch_size": 0}, r"patchmerger.batch_size=0 is out of range; it must be >= 1"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ParamError, match=message):
        make_params("patchmerger", PatchMergerParams, kwargs)  # what the command line, the plan and apply go through


@pytest.mark.parametrize("kwargs, message", [
    ({"layer": 12}, r"patchmerger.layer=12 is out of range; valid block indices for this model: 0..11"),
    ({"tokens": 65}, r"patchmerger.tokens=65 is out of range; this model has 64 patch tokens, so it must be in 1..64"),
])
def test_settings_the_model_cannot_take_name_its_range(kwargs, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "patchmerger", **kwargs)


def test_token_counts_follow_the_layer_and_m(vit):
    """test_vit: 100 patches + class token, 6 blocks; the merge runs in block ``layer``."""
    x = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    for kwargs, counts in [({}, [101, 101, 9, 9, 9, 9]), ({"tokens": 20, "layer": 0}, [21] * 6),
                           ({"tokens": 100, "layer": 5}, [101] * 6)]:
        model = vitbench.apply(copy.deepcopy(vit), "patchmerger", **kwargs)
        with torch.no_grad():
            assert torch.isfinite(model(x)).all()
        assert reduction_context(model).token_counts == counts


def test_output_is_m_weighted_averages_whose_weights_sum_to_one():
    """The oracle (paper §2): ``Y = softmax(W LN(X)^T) X`` on the patches; prefix tokens untouched."""
    torch.manual_seed(0)
    merger = PatchMergerReducer(dim=16, tokens=5)
    x = torch.randn(3, 1 + 12, 16)
    state = TokenState.start(x, prefix=1, trace_source=True)
    y = merger(x, state, AttnInfo())
    assert y.shape == (3, 1 + 5, 16)
    w = merger.weights(x[:, 1:])
    assert w.shape == (3, 5, 12) and (w > 0).all()
    assert torch.allclose(w.sum(dim=-1), torch.ones(3, 5))  # per output, over the input tokens
    ln = torch.nn.functional.layer_norm(x[:, 1:], (16,))
    oracle = torch.softmax(torch.einsum("mc,bnc->bmn", merger.queries, ln), dim=-1) @ x[:, 1:]
    assert torch.allclose(y[:, 1:], oracle, atol=1e-6) and torch.equal(y[:, :1], x[:, :1])
    # bookkeeping: sizes and sources are shared out, so they still add up to the patches
    assert torch.allclose(state.size[:, 1:].sum(dim=1), torch.full((3, 1), 12.0))
    assert torch.equal(state.size[:, :1], torch.ones(3, 1, 1))
    assert torch.allclose(state.source[:, 1:].sum(dim=1), torch.cat([torch.zeros(3, 1), torch.ones(3, 12)], 1))


def test_gradients_reach_the_queries_and_the_norm_only_from_the_merger():
    model = vitbench.apply(tiny_vit(), "patchmerger", tokens=4)
    for p in model.parameters():
        p.requires_grad_(False)
    merger = _mergers(model)[0]
    for p in merger.parameters():
        p.requires_grad_(True)
    model.train()
    model(torch.randn(2, 3, 32, 32)).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in merger.parameters())


def test_conforms():
    report = check_method("patchmerger")
    assert report.token_counts == [65] * 5 + [9] * 7
    assert check_method("patchmerger", {"tokens": 16, "layer": 0}).token_counts == [17] * 12


def test_matched_compute_sets_m(calibrated_on_tiny_vit):
    result = calibrated_on_tiny_vit("patchmerger", 0.6)
    assert result.param == "tokens" and isinstance(result.value, int) and 1 <= result.value <= 64
    assert abs(result.calibrated_gmacs / (0.6 * result.baseline_gmacs) - 1) <= TOLERANCE


def test_fine_tunes_through_the_run_path(fine_tuned_run):
    """A short fine-tuning on test_vit through ``vitbench run``: finite numbers, fewer GMACs."""
    fine_tuned_run("patchmerger", "patchmerger.tokens=8")
