"""Token Cropr (plugins/cropr/): the schedule and its token counts, the scorer against the summed
cross-attention logits, inference keeping the best-scored patches in score order before the
block's attention, the auxiliary losses and where their gradients go, conformance, fine-tuning
through the run path and bad parameters."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F

import vitbench
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.host import get_host
from vitbench.measure import count_gmacs
from vitbench.testing import check_method, tiny_vit
from vitbench_plugins.cropr.reduction import CroprReducer, SelectionModule, module_rates

pytestmark = pytest.mark.usefixtures("single_thread")


def _images(n: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _reducers(model) -> list[CroprReducer]:
    return [m for m in model.modules() if isinstance(m, CroprReducer)]


def test_registers_as_a_learnable_pruning_method_with_a_rate_knob():
    spec = get_host().method("cropr")
    assert (spec.kind, get_host().families_for(spec), spec.needs_training) == ("pruning", ["vit"], True)
    assert (spec.budget.param, spec.budget.larger_means, spec.budget.integer) == ("rate", "less", True)


def test_a_module_after_every_block_but_the_last_the_first_pruning_one_more():
    assert module_rates(8, 12) == [0, 9] + [8] * 10 and module_rates(0, 12) == [0] * 12
    model = vitbench.apply(tiny_vit(), "cropr")
    assert [r.rate for r in _reducers(model)] == [9] + [8] * 10
    assert [b.reducer is None for b in model.blocks] == [True] + [False] * 11


@pytest.mark.parametrize("rate, counts", [
    (8, [65, 56, 48, 40, 32, 24, 16, 8, 2, 2, 2, 2]),  # 64 patches: 9, then 8 a module, one patch kept at least
    (3, [65, 61, 58, 55, 52, 49, 46, 43, 40, 37, 34, 31]),
])
def test_token_counts_follow_the_rate(rate, counts):
    model = vitbench.apply(tiny_vit(), "cropr", rate=rate)
    with torch.inference_mode():
        model(_images())
    assert reduction_context(model).token_counts == counts


def test_rate_zero_is_the_unpatched_model():
    base = tiny_vit()
    model = vitbench.apply(copy.deepcopy(base), "cropr", rate=0)
    x = _images()
    with torch.inference_mode():
        assert torch.equal(model(x), base(x))


def test_the_scores_are_the_cross_attention_logits_summed_over_queries_and_heads():
    torch.manual_seed(0)
    module = SelectionModule(dim=12, queries=3, heads=2, mlp_ratio=4.0, num_classes=5)
    x = torch.randn(2, 7, 12)
    q = module.queries[0]  # [M, C]
    expected = sum((q[m, h * 6:(h + 1) * 6] * x[..., h * 6:(h + 1) * 6]).sum(-1) for m in range(3) for h in range(2))
    aux, scores = module(x)
    assert torch.allclose(module.scores(x), expected, atol=1e-5)
    assert torch.allclose(scores, expected, atol=1e-5) and aux.shape == (2, 5)


def test_inference_keeps_the_best_scored_patches_in_descending_score_before_the_attention():
    """Block 1's attention sees the class token, then the 55 patches with the highest scores of
    block 0's output tokens, best first."""
    model = vitbench.apply(tiny_vit(), "cropr")
    seen = {}
    model.blocks[0].register_forward_hook(lambda mod, args, out: seen.setdefault("out", out))
    model.blocks[1].block.norm1.register_forward_hook(lambda mod, args, out: seen.setdefault("attn_in", args[0]))
    with torch.inference_mode():
        model(_images())
        tokens = seen["out"]
        scores = _reducers(model)[0].selection.scores(tokens)[:, 1:]
    best = scores.argsort(dim=1, descending=True)[:, :55] + 1
    expected = torch.cat([tokens[:, :1], tokens.gather(1, best[..., None].expand(-1, -1, tokens.shape[-1]))], 1)
    assert torch.equal(seen["attn_in"], expected)


def test_training_adds_one_auxiliary_cross_entropy_a_module():
    model = vitbench.apply(tiny_vit(), "cropr", rate=4, label_smoothing=0.0)
    model.train()
    x, labels = _images(4), torch.tensor([0, 1, 2, 3])
    logits = model(x)
    ctx = reduction_context(model)
    aux = ctx.state.private["cropr_aux"]
    assert len(aux) == 11 and all(a.shape == (4, 10) for a in aux)
    loss = ctx.reduction.train[0].extra_loss(model, logits, labels)
    assert torch.allclose(loss, sum(F.cross_entropy(a, labels) for a in aux))
    assert torch.equal(ctx.extras["cropr_aux_loss"], loss.detach())
    assert ctx.token_counts == [65, 60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20]  # pruned in training too


def test_the_auxiliary_losses_train_the_modules_only_and_the_task_loss_the_backbone_only():
    """The modules read detached tokens and choose without a gradient: the auxiliary losses
    reach no backbone weight, the task's cross-entropy no module weight."""
    model = vitbench.apply(tiny_vit(), "cropr", rate=4)
    model.train()
    x, labels = _images(4), torch.tensor([0, 1, 2, 3])
    logits = model(x)
    aux = reduction_context(model).reduction.train[0].extra_loss(model, logits, labels)
    named = dict(model.named_parameters())
    modules = {k for k in named if ".reducer." in k}
    aux_grads = torch.autograd.grad(aux, list(named.values()), allow_unused=True)
    task_grads = torch.autograd.grad(F.cross_entropy(logits, labels), list(named.values()), allow_unused=True)
    for (name, _), g_aux, g_task in zip(named.items(), aux_grads, task_grads):
        if name in modules:
            assert g_task is None and (g_aux is None or "head" in name or g_aux.abs().sum() > 0), name
        else:
            assert g_aux is None, name
    assert all(g is not None for (name, _), g in zip(named.items(), aux_grads) if name.endswith("queries"))


def test_the_stage_fine_tunes_the_whole_network_with_the_modules_at_their_own_rate():
    model = vitbench.apply(tiny_vit(), "cropr", lr=1e-5, module_lr=2e-3, epochs=2)
    (stage,) = reduction_context(model).reduction.train
    assert stage.backbone and stage.epochs == 2 and stage.lr == 1e-5
    assert stage.lr_groups == (("reducer.", 2e-3),) and stage.label_smoothing == 0.1


def test_fine_tunes_through_the_run_path(fine_tuned_run):
    """``vitbench run --methods cropr``: fine-tuned, finite numbers, fewer GMACs, and the record
    says the stage trained the backbone (the report's "backbone trained")."""
    _, reduced = fine_tuned_run("cropr", "cropr.rate=2")
    assert reduced["train_stages"][0]["backbone"] is True
    backbone = timm.create_model("test_vit", pretrained=False, num_classes=2)
    assert reduced["trainable_params"] > sum(p.numel() for p in backbone.parameters())


def test_conforms():
    report = check_method("cropr")
    assert report.token_counts == [65, 56, 48, 40, 32, 24, 16, 8, 2, 2, 2, 2]


def test_fewer_gmacs_than_the_baseline():
    x = torch.randn(1, 3, 32, 32)
    base = count_gmacs(tiny_vit(), x).mean
    assert count_gmacs(vitbench.apply(tiny_vit(), "cropr"), x).mean < base
    assert count_gmacs(vitbench.apply(tiny_vit(), "cropr", rate=0), x).mean == base


@pytest.mark.parametrize("params, message", [
    ({"heads": 5}, r"cropr.heads=5 does not divide the model's width 48; give a divisor of 48"),
    ({"rate": -1}, r"cropr.rate=-1 is out of range"),
    ({"queries": 0}, r"cropr.queries=0 is out of range"),
])
def test_bad_parameters_name_the_value(params, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(tiny_vit(), "cropr", **params)


def test_a_model_without_a_classifier_is_refused():
    with pytest.raises(ParamError, match=r"cropr trains auxiliary classifiers and needs a model with a "
                                         r"classification head"):
        vitbench.apply(tiny_vit(num_classes=0), "cropr")


def test_after_training_each_module_keeps_only_its_scorer():
    """The stage's ``after`` drops the aggregation and the auxiliary heads (the paper removes
    them): the model counts the backbone and 11 queries of 48, and infers as before."""
    base = tiny_vit()
    model = vitbench.apply(copy.deepcopy(base), "cropr")
    (stage,) = reduction_context(model).reduction.train
    x = _images()
    with torch.inference_mode():
        before = model(x)
    for callback in stage.after:
        callback(model)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in base.parameters()) + 11 * 48
    with torch.inference_mode():
        assert torch.equal(model(x), before)
    model.train()
    model(x)  # training mode without heads: it prunes by the scores and records nothing to learn from
    assert "cropr_aux" not in reduction_context(model).state.private
