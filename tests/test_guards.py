"""vitbench.core.guards: what becomes non-finite is named, with where, and finite values pass."""
from __future__ import annotations

import pytest
import torch
from mmengine.structures import InstanceData
from torch import nn

from vitbench.errors import NonFiniteError, VitbenchError
from vitbench.core.guards import check_finite, check_gradients, check_losses, check_metrics, nonfinite_tensors

NAN, INF = float("nan"), float("inf")
WHERE = "in stage 'finetune', epoch 1, iteration 37"


def test_check_losses_names_the_bad_term_not_the_total():
    losses = {"ce": torch.tensor(0.7), "extra": torch.tensor(NAN), "loss": torch.tensor(NAN)}
    with pytest.raises(NonFiniteError) as err:
        check_losses(losses, "ltm", WHERE)
    assert str(err.value) == f"ltm: the loss became non-finite (extra = nan) {WHERE}"
    assert isinstance(err.value, VitbenchError)


def test_check_losses_names_the_total_when_no_term_explains_it():
    with pytest.raises(NonFiniteError, match=r"^m: the loss became non-finite \(loss = inf\) at step 1$"):
        check_losses({"loss": torch.tensor(INF)}, "m", "at step 1")
    with pytest.raises(NonFiniteError, match=r"\(loss_cls = -inf, loss_bbox = nan\)"):
        check_losses({"loss_cls": -INF, "loss_bbox": NAN, "loss": NAN}, "m", "")


def test_finite_values_pass():
    check_losses({"ce": torch.tensor(1.0), "loss": 2.0}, "m", "")
    check_losses({}, "m", "")
    layer = nn.Linear(3, 2)
    layer(torch.ones(1, 3)).sum().backward()
    check_gradients(layer.named_parameters(), "m", "")
    check_gradients([], "m", "")
    check_finite({"a": [torch.ones(2), (torch.zeros(1), 3)], "ints": torch.tensor([1, 2])}, "x", "")
    check_metrics({"box_map": 0.4, "n": 3, "flag": True, "name": "x"}, "mAP")


def test_check_gradients_names_the_first_bad_parameter_and_counts_the_others():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model(torch.ones(2, 3)).sum().backward()
    model[0].weight.grad[0, 0] = NAN
    model[1].bias.grad[:] = INF
    with pytest.raises(NonFiniteError) as err:
        check_gradients(model.named_parameters(), "dcs", WHERE)
    assert str(err.value) == (f"dcs: the gradient of 0.weight and 1 other parameter(s) became non-finite "
                              f"(1 of 12 values) {WHERE}")


def test_check_finite_walks_nested_outputs_and_instance_data():
    preds = InstanceData(bboxes=torch.tensor([[0.0, 1.0, NAN, 3.0]]), scores=torch.tensor([0.5]),
                         labels=torch.tensor([1]))
    bad = nonfinite_tensors([None, {"preds": preds}])
    assert [path for path, _ in bad] == ["1.preds.bboxes"]
    with pytest.raises(NonFiniteError, match=r"^mAP: the boxes hold non-finite values \(1\.preds\.bboxes: 1 of 4\) "
                                             r"in batch 2$"):
        check_finite([None, {"preds": preds}], "mAP: the boxes", "in batch 2")
    with pytest.raises(NonFiniteError, match=r"^evaluation: the logits hold non-finite values \(3 of 6\) in batch 1$"):
        check_finite(torch.tensor([[1.0, -INF, NAN], [0.0, 1.0, INF]]), "evaluation: the logits", "in batch 1")


def test_check_metrics_names_each_bad_value():
    with pytest.raises(NonFiniteError, match=r"^IB metrics: non-finite IB loss = nan, IB bound = inf$"):
        check_metrics({"IB loss": torch.tensor(NAN), "IB bound": INF, "input constant": -1.0}, "IB metrics")
