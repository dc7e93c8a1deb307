"""The training step's throughput: images per second of a forward and backward in training mode
(OpenToMe's forward+backward timing; ToMe, Sec. 4.3: merging speeds up training), on a copy of the
model so that its gradients and normalisation statistics never reach the measured one."""
from __future__ import annotations

import copy
import time
from typing import Optional

import torch
from torch import nn

from vitbench.core import progress
from vitbench.measure.load import machine_load
from vitbench.measure.precision import DEFAULT_PRECISION, autocast
from vitbench.measure.speed import ThroughputResult, quiet_timing, throughput_of, timing_input
from vitbench.measure._common import synchronize

__all__ = ["measure_train_throughput", "train_step_loss"]


def train_step_loss(logits: torch.Tensor) -> torch.Tensor:
    """A loss that touches every logit, needs no labels and costs next to nothing: the mean log-sum-exp."""
    return logits.float().logsumexp(dim=-1).mean()


def _timed_step(model: nn.Module, x: torch.Tensor, device: torch.device, precision: str) -> float:
    """Seconds of one forward and backward of ``model`` on ``x`` (gradients cleared after)."""
    synchronize(device)
    start = time.perf_counter()
    with autocast(precision, device):
        loss = train_step_loss(model(x))
    loss.backward()
    synchronize(device)
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return max(seconds, 1e-12)


def measure_train_throughput(model: nn.Module, batch_size: int, input_size: tuple[int, int, int] = (3, 224, 224),
                             device: str | torch.device = "cpu", warmup: Optional[int] = None, repeats: int = 10,
                             precision: str = DEFAULT_PRECISION,
                             images: Optional[torch.Tensor] = None) -> ThroughputResult:
    """Training-step throughput at ``batch_size``: a copy of ``model`` in training mode with every
    parameter trainable runs forward, a label-free loss (:func:`train_step_loss`) and backward
    ``repeats`` times after a warm-up; median and IQR of images per second, as
    :func:`~vitbench.measure.speed.measure_throughput` gives for the forward."""
    what = f"timing the training step (batch {batch_size})"
    trainee = copy.deepcopy(model).train()
    for p in trainee.parameters():
        p.requires_grad_(True)
    x, dev, warmup = timing_input((trainee,), batch_size, input_size, device, warmup, repeats, images=images)

    def once() -> ThroughputResult:
        before = machine_load()
        seconds: list[float] = []
        with progress.steps(what, warmup + repeats, "training steps", timing=True) as step:
            for i in range(warmup + repeats):
                took = _timed_step(trainee, x, dev, precision)
                if i >= warmup:
                    seconds.append(took)
                step.advance()
        return throughput_of(seconds, batch_size, warmup, before, machine_load())

    return quiet_timing(once, what)
