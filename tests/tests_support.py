"""A small learnable method for the fine-tuning loop's tests (``test-gate``).

Registered through :func:`register_gate` (the ``gate_method`` fixture in conftest.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitbench.catalog import MethodSpec, Reduction, TrainStage
from vitbench.engine import Reducer, reduction_context
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host

CALLS: list[tuple] = []
#: the stage the loop said was training (``reduction_context(model).stage``) at each epoch end
STAGES_SEEN: list = []
#: the gate's scale after every step, then as the stage's ``after`` callback sees it
SCALES: list = []


class Gate(nn.Module, Reducer):
    """Scales the patch tokens by a learnable factor (starts at 1: the model is unchanged); the
    prefix tokens stay as they are (the token rules, vitbench.engine.token_rules)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.alpha = nn.Parameter(torch.zeros(1))
        self.register_buffer("epochs_seen", torch.zeros(()))

    def forward(self, x, state, info):
        p = state.prefix
        return torch.cat([x[:, :p], x[:, p:] * self.scale * (1 + self.alpha)], dim=1)


@dataclass(frozen=True)
class GateParams:
    epochs: int = 1
    arch_fraction: float = 0.0
    two_stages: bool = False
    nan_extra_at: int = 0  # the step (from 1) whose extra loss is NaN (0: never)
    nan_buffer: bool = False  # epoch_end writes NaN into a buffer (non-finite weights after training)
    ema_decay: float = 0.0  # the stage's moving-average decay (0: none)


def _build(params: GateParams, info) -> Reduction:
    gates = [Gate(info.embed_dim) if i == 0 else None for i in range(info.depth)]

    steps = [0]

    def _scale():
        return gates[0].scale.detach().clone()

    def extra(model, logits, labels):
        reduction_context(model).extras["seen"] = labels.numel()
        steps[0] += 1
        nan = float("nan") if steps[0] == params.nan_extra_at else 0.0
        return 0.01 * (gates[0].scale - 1).pow(2).sum() + nan

    def before(model, batches):
        n = sum(len(y) for _, y in batches())
        CALLS.append(("before", n, model.training))

    def epoch_end(model, epoch, batches):
        gates[0].epochs_seen += float("nan") if params.nan_buffer else 1
        CALLS.append(("epoch_end", epoch))
        STAGES_SEEN.append(reduction_context(model).stage)

    stage = TrainStage(name="search", epochs=params.epochs, lr=0.05, optimizer="SGD", batch_size=32,
                       extra_loss=extra, before=(before,), epoch_end=(epoch_end,),
                       after_step=(lambda m: CALLS.append(("step",)), lambda m: SCALES.append(_scale())),
                       after=(lambda m: CALLS.append(("after",)), lambda m: SCALES.append(_scale())),
                       arch_keys=("alpha",), arch_fraction=params.arch_fraction,
                       ema_decay=params.ema_decay or None)
    stages = [stage]
    if params.two_stages:
        stages.append(TrainStage(name="retrain", epochs=1, lr=0.05, batch_size=32, trainable=("scale",)))
    return Reduction(gates, train=tuple(stages))


class _Plugin:
    @hookimpl
    def vitbench_register_methods(self, register):
        register(MethodSpec(name="test-gate", params=GateParams, build=_build, needs_training=True))



def register_gate() -> str:
    get_host().add_plugin(_Plugin(), "test_gate")
    CALLS.clear()
    STAGES_SEEN.clear()
    SCALES.clear()
    return "test-gate"


def sharp_vit():
    """tiny_vit with sharper attention (qkv x6), so importances differ enough to prune."""
    from vitbench.testing import tiny_vit

    model = tiny_vit()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(6.0)
    return model
