"""Cost models (vitbench/kit/cost.py): the fixed part counted, the variable part by formula."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitbench.kit import CostModel, counted_fixed, linear_macs, probe_image
from vitbench.measure import count_gmacs


class _Toy(nn.Module):
    """A patch convolution (fixed: 16 positions x 4 x 3 x 2 x 2 = 768 MACs), then a 4 -> 5 Linear
    on the first ``keep`` of the 16 tokens (variable: 20 MACs per token kept)."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep
        self.conv = nn.Conv2d(3, 4, kernel_size=2, stride=2)
        self.linear = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv(x).flatten(2).transpose(1, 2)
        return self.linear(tokens[:, : self.keep])


@dataclass(frozen=True)
class _ToyCost(CostModel):
    fixed: float

    @property
    def full(self) -> float:
        return self.fixed + 20 * 16

    def terms(self, keep):
        yield 20.0 * keep


def test_counted_fixed_is_the_count_less_the_formula_at_the_counted_decision():
    model = _Toy(keep=6)
    image = probe_image(model, (8, 8))
    assert image.shape == (1, 3, 8, 8) and not image.any()
    cost = _ToyCost(fixed=counted_fixed(model, image, lambda: 20.0 * model.keep))
    assert cost.fixed == 768.0
    for keep in (0, 9, 16):
        assert cost.macs(keep) == count_gmacs(_Toy(keep), image).mean * 1e9
    assert cost.ratio(8) == (768 + 160) / (768 + 320)


def test_terms_are_added_in_order_and_stay_differentiable():
    keep = torch.tensor(3.0, requires_grad=True)
    macs = _ToyCost(fixed=768.0).macs(keep)
    macs.backward()
    assert macs.item() == 828.0 and keep.grad.item() == 20.0


def test_linear_macs_counts_every_linear_once_per_token():
    assert linear_macs(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))) == 30.0
