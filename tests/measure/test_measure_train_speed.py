"""The training step's throughput (``--metrics train_throughput``; issue 63, item 5): a forward and
backward on a copy in training mode, the measured model untouched, a failing method's reason kept."""
from __future__ import annotations

import copy
import json

import torch
from torch import nn

import vitbench
from vitbench.cli.main import main
from vitbench.core.metrics import DEFAULT_METRICS, METRICS
from vitbench.measure.train_speed import measure_train_throughput, train_step_loss
from vitbench.tasks.common import train_throughput_fields
from vitbench.testing import tiny_vit


def test_the_loss_is_the_mean_log_sum_exp_of_the_logits():
    logits = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    expected = (torch.log(torch.tensor(2.0)) + torch.logsumexp(torch.tensor([1.0, 2.0]), 0)) / 2
    assert torch.allclose(train_step_loss(logits), expected)


def test_a_training_step_is_timed_on_a_copy_and_the_model_stays_as_it_was():
    model = tiny_vit(depth=4).eval()
    model.head.weight.requires_grad_(False)
    before = copy.deepcopy(model.state_dict())
    tp = measure_train_throughput(model, 4, (3, 32, 32), repeats=3, warmup=1)
    assert tp.median_img_s > 0 and tp.repeats == 3 and tp.batch_size == 4 and tp.median_ms > 0
    assert not model.training and not model.head.weight.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_merging_makes_the_training_step_cheaper_in_work():
    """ToMe halving the tokens: the copy's backward runs on the merged tokens, so the reduced
    model's step does less (the ratio itself is a timing: checked by the benchmark, not here)."""
    model = vitbench.apply(tiny_vit(depth=4).eval(), "tome", r=16)
    fields = train_throughput_fields(model, 2, (3, 32, 32), device="cpu", repeats=2, precision="fp32", images=None)
    assert fields["train_throughput_img_s"] > 0 and fields["train_throughput_repeats"] == 2
    assert "train_throughput_flagged" in fields and "train_throughput_error" not in fields


class _FailsInTraining(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError("this reducer needs labels in training")
        return self.fc(x.mean(dim=(2, 3)))


def test_a_training_forward_that_fails_keeps_its_reason_not_a_number():
    fields = train_throughput_fields(_FailsInTraining(), 2, (3, 8, 8), device="cpu", repeats=2, precision="fp32",
                                     images=None)
    assert fields == {"train_throughput_error": "RuntimeError: this reducer needs labels in training"}


def test_it_is_measured_only_when_asked_and_the_report_shows_it(tmp_path):
    assert "train_throughput" in METRICS and "train_throughput" not in DEFAULT_METRICS
    out = tmp_path / "out"
    assert main(["run", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--param", "tome.r=8",
                 "--metrics", "gmacs,train_throughput", "--batch-size", "2", "--repeats", "2", "--no-wait",
                 "--out", str(out)]) == 0
    base, tome = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert base["train_throughput_img_s"] > 0 and tome["train_throughput_img_s"] > 0
    assert "throughput_img_s" not in base  # the forward was not asked for
    report = (out / "report.md").read_text()
    assert "Train step (img/s)" in report and "Train speed-up (×)" in report
